"""What can be checked here of ``deploy/`` without a cluster: the files parse, the RBAC grants
exactly what the reaper's Kubernetes calls need, the Helm values match the image the Dockerfile builds, and
the sample config's sweep store is one each executor's workers share."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import pytest
import yaml

from reaper.config import ConfigError, load_config
from reaper.sweep.factory import refuse_unshared_store
from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
CHART_HOME = PurePosixPath("/opt/airflow")  # the official chart's airflowHome default, the image's AIRFLOW_HOME


def values(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def dockerfile() -> tuple[str, dict[str, PurePosixPath]]:
    """The Airflow version of the base image, and where each top-level folder is copied to."""
    text = (ROOT / "Dockerfile").read_text()
    version = re.search(r"^FROM apache/airflow:(\d+\.\d+\.\d+)-python", text, re.M)
    assert version, "the Dockerfile's base image is not apache/airflow:X.Y.Z-pythonA.B"
    copies = re.findall(r"^COPY (?:--\S+ )*(\w+)/ (\S+)$", text, re.M)
    return version.group(1), {src: PurePosixPath(dst) for src, dst in copies}


def rbac(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


@pytest.mark.parametrize(
    ("name", "role_kind", "binding_kind"),
    [
        ("rbac-swept-cluster.yaml", "Role", "RoleBinding"),
        ("rbac-swept-cluster-all-namespaces.yaml", "ClusterRole", "ClusterRoleBinding"),
    ],
)
def test_the_swept_cluster_rbac_grants_list_and_delete_on_the_three_kinds_only(
    name: str, role_kind: str, binding_kind: str
) -> None:
    docs = rbac(name)
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert [r["kind"] for r in roles] == [role_kind]
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in roles[0]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    needed = {"list", "delete"}  # the inventory and the re-reads before a delete list (by name); then delete
    assert granted == {
        ("", "pods"): needed,
        ("", "secrets"): needed,
        ("networking.k8s.io", "networkpolicies"): needed,
    }
    (binding,) = [d for d in docs if d["kind"].endswith("RoleBinding")]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert binding["kind"] == binding_kind
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": roles[0]["metadata"]["name"]}
    assert binding["roleRef"] == role
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]


def test_the_namespaced_role_is_in_the_namespaces_the_sample_config_lists() -> None:
    """The Role only works if the reaper lists those namespaces one by one (k8s.namespaces)."""
    namespaces = load_config(DEPLOY / "reaper.yaml").k8s.namespaces
    docs = rbac("rbac-swept-cluster.yaml")
    assert namespaces
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] in ("Role", "RoleBinding")} == set(namespaces)


def test_the_helm_values_run_the_image_the_dockerfile_builds() -> None:
    version, copies = dockerfile()
    common = values("values.yaml")
    assert common["airflowVersion"] == common["defaultAirflowTag"] == version
    # The chart reads DAGs and plugins from its airflowHome; the image has them there, so no DAG volume.
    assert copies["dags"] == CHART_HOME / "dags" and copies["plugins"] == CHART_HOME / "plugins"
    assert not common["dags"]["persistence"]["enabled"] and not common["dags"]["gitSync"]["enabled"]
    config = PurePosixPath(next(e["value"] for e in common["env"] if e["name"] == "REAPER_CONFIG"))
    (mount,) = [m for m in common["volumeMounts"] if config.parent == PurePosixPath(m["mountPath"])]
    (volume,) = [v for v in common["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "reaper-config" and config.name == "reaper.yaml"
    # The mounted config never hides what the image brings.
    assert all(not PurePosixPath(mount["mountPath"]).is_relative_to(dst) for dst in copies.values())
    assert "reaper-connections" in common["extraEnvFrom"]


@pytest.mark.parametrize(
    ("overlay", "executor"),
    [("values-celery.yaml", "CeleryExecutor"), ("values-kubernetes.yaml", "KubernetesExecutor")],
)
def test_each_executor_gets_a_sweep_store_its_workers_share(overlay: str, executor: str, monkeypatch) -> None:
    chosen = values(overlay)
    assert chosen["executor"] == executor
    if executor == "CeleryExecutor":
        assert chosen["workers"]["persistence"]["enabled"] is False
        assert chosen["config"]["celery_broker_transport_options"]["visibility_timeout"] >= 6 * 3600
    monkeypatch.setenv("REAPER_CONFIG", str(DEPLOY / "reaper.yaml"))
    config = load_config(DEPLOY / "reaper.yaml")
    assert config.airflow.sweep_store.startswith("gs://")
    refuse_unshared_store(config, [executor])  # raises for a store on one machine's disk
    local = config.model_copy(update={"airflow": config.airflow.model_copy(update={"sweep_store": "file:///x"})})
    with pytest.raises(ConfigError, match=r"airflow\.sweep_store"):
        refuse_unshared_store(local, [executor])
