"""Kubernetes inventory through the real ``kubernetes`` client against the emulator."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter

import pytest

from include.emulators.k8s import RESOURCE_OF_KIND
from include.emulators.shapes import kube_pod, kube_run
from reaper.k8s.client import api_client_from_connection
from reaper.k8s.inventory import list_cluster
from reaper.model import Evidence, incomplete_scopes
from reaper.retry import Backoff
from tests.builders import NOW_DT, leases, plan, runs
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, seed_pod, seed_run

SECRET_VALUE = "c3VwZXItc2VjcmV0LXRva2VuLWRvLW5vdC1sZWFr"


def listing(api, **kw):
    return list_cluster(api, "c1", MANAGED, fast_backoff(kw.pop("retries", 4)), 10)


def test_every_managed_object_listed_once_across_pages_with_selector_pushdown(kube) -> None:
    cluster, api, _ = kube
    for r in range(300):
        seed_run(cluster, f"run-{r:03d}")
    seed_pod(cluster, "web", {"app": "web"})
    result = listing(api)
    assert result.complete
    assert Counter(o.kind for o in result.resources) == {"Pod": 300, "Secret": 600, "NetworkPolicy": 300}
    assert len({(o.kind, o.uid) for o in result.resources}) == 1200
    assert "web" not in {o.name for o in result.resources}
    lists = [path for method, path in cluster.requests if method == "GET"]
    assert len(lists) == 1 + 2 + 1  # pods, secrets (600 -> 2 pages), networkpolicies
    assert all("labelSelector=iterion.io%2Fmanaged%3Dtrue" in p and "limit=500" in p for p in lists)


def test_secrets_are_listed_metadata_only_and_their_data_never_logged(kube, caplog) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "run-1")
    caplog.set_level(logging.DEBUG)
    result = listing(api)
    secrets = [o for o in result.resources if o.kind == "Secret"]
    assert len(secrets) == 2 and all(o.labels["iterion.io/run-id"] == "run-1" for o in secrets)
    assert cluster.secret_data_served is False
    assert SECRET_VALUE not in caplog.text


def test_emulator_does_flag_a_full_secret_read(kube) -> None:
    # The guard above is only worth something if the flag trips when data is served.
    cluster, api, _ = kube
    seed_run(cluster, "run-1")
    api.call_api("/api/v1/secrets", "GET", auth_settings=["BearerToken"], _preload_content=False)
    assert cluster.secret_data_served is True


def test_expired_continue_token_restarts_the_list_once(kube) -> None:
    cluster, api, _ = kube
    for r in range(300):
        seed_run(cluster, f"run-{r:03d}")
    cluster.faults.expire_continue_tokens = 1
    result = listing(api)
    assert result.complete and len(result.resources) == 1200


def test_a_second_expiry_marks_the_cluster_incomplete(kube) -> None:
    cluster, api, _ = kube
    for r in range(300):
        seed_run(cluster, f"run-{r:03d}")
    cluster.faults.expire_continue_tokens = 2
    result = listing(api)
    assert not result.complete and result.problems == ["Secret: HTTP 410 Gone"]
    assert incomplete_scopes([result]) == {("k8s", "c1")}


def test_persistent_errors_mark_the_cluster_incomplete_and_transient_ones_are_retried(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "run-1")
    cluster.faults.fail_next["list"] = ["503", "429"]
    assert listing(api).complete
    cluster.faults.fail_next["list"] = ["503"] * 3
    result = listing(api, retries=2)
    assert not result.complete and result.problems[0].startswith("Pod: HTTP 503")


def test_a_throttled_page_is_retried_after_its_retry_after(kube) -> None:
    # API Priority and Fairness answers 429 with the seconds to wait: the listing waits that long, not
    # the backoff's milliseconds (a listing has no delete deadline; the wait is capped and bounded by retries).
    cluster, api, _ = kube
    seed_run(cluster, "run-1")
    cluster.faults.retry_after = "1"
    cluster.faults.fail_next["list"] = ["429"]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    result = list_cluster(api, "c1", MANAGED, Backoff(4, base=0.01, cap=0.05, sleep=sleep), 10)
    assert result.complete and len(result.resources) == 4 and slept == [1.0]


def test_hygiene_findings(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "run-1", deadline=None)
    findings = Counter(listing(api).hygiene)
    assert findings == {"pod_without_active_deadline": 1, "no_owner_reference": 4}


def test_api_client_from_the_airflow_connection(kube, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, _, emulator = kube
    seed_run(cluster, "run-1")
    extra = {"kube_config": json.dumps(emulator.kubeconfig())}
    monkeypatch.setenv("AIRFLOW_CONN_KUBE_EMULATOR", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    result = listing(api_client_from_connection("kube_emulator"))
    assert result.complete and len(result.resources) == 4


def test_a_repeated_continue_token_stops_the_list_and_marks_the_cluster_incomplete(kube) -> None:
    # A server answering the same continue token again made ~22,000 list calls in 8 s.
    cluster, api, _ = kube
    for r in range(3):
        seed_run(cluster, f"r{r}")
    cluster.faults.repeat_continue_tokens = 1_000_000
    listing = list_cluster(api, "c1", MANAGED, fast_backoff(), 10, page_size=1)
    assert not listing.complete and all("repeated a continue token" in p for p in listing.problems)
    assert cluster.counters["list"] <= 3 * 3, "the list kept following the same token"


def _sidecar_pod(run: str, created: float, phase: str, state: dict, restart_policy: str, native: bool) -> dict:
    """A run's Pod whose results-egress sidecar reports ``state``, as the API server serves it."""
    labels = {**MANAGED, "iterion.io/run-id": run}
    pod = kube_pod(f"sandbox-{run}", "ci", f"{run}-pod", labels, created, phase=phase)
    pod["spec"]["restartPolicy"] = restart_policy
    status = {"name": "results-egress", "image": "registry.example/egress:0.3", "restartCount": 0, "state": state}
    if native:  # a native sidecar: an init container with restartPolicy Always
        pod["spec"]["initContainers"] = [{"name": "results-egress", "restartPolicy": "Always"}]
        pod["status"]["initContainerStatuses"] = [status]
    else:
        pod["spec"]["containers"].append({"name": "results-egress"})
        pod["status"]["containerStatuses"].append(status)
    return pod


RUNNING = {"running": {"startedAt": "2026-11-29T11:00:00Z"}}
EXIT_1 = {"terminated": {"exitCode": 1, "reason": "Error"}}
SIDECARS: dict[str, tuple[str, dict, str, bool]] = {  # each of these still holds results in its emptyDir
    "succeeded-sidecar-running": ("Succeeded", RUNNING, "Never", False),
    "failed-sidecar-running": ("Failed", RUNNING, "Never", False),
    "native-sidecar-exit-1": ("Running", EXIT_1, "Never", True),
    "exit-1-onfailure": ("Running", EXIT_1, "OnFailure", False),
    "finished": ("Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed"}}, "Never", False),
}


def test_an_egress_sidecar_that_may_still_upload_keeps_its_run_as_listed(kube) -> None:
    """docs/design.md §5 row 6 on Pods as the API server serves them: only a sidecar finished for good lets go."""
    cluster, api, _ = kube
    created = NOW_DT.timestamp() - 3600  # the builders' clock
    for run, pod in SIDECARS.items():
        for obj in kube_run(run, "ci", created, MANAGED):
            obj = _sidecar_pod(run, created, *pod) if obj["kind"] == "Pod" else obj
            cluster.create(RESOURCE_OF_KIND[obj["kind"]], "ci", obj)
    objects = listing(api).resources
    decided = plan(objects, Evidence(leases=leases([]), runs=runs(dict.fromkeys(SIDECARS, "succeeded"))))
    reasons = {d.resource.labels["iterion.io/run-id"]: (d.action.value, d.reason) for d in decided.decisions}
    assert reasons == {
        **{run: ("report", "results_egress_in_progress") for run in SIDECARS if run != "finished"},
        "finished": ("delete", "sandbox_orphan"),
    }
