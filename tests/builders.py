"""Small builders of normalized resources and evidence for the policy tests, relative to ``NOW``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime

from reaper.config import Settings, parse_settings
from reaper.model import Evidence, GceGroup, GceInstance, K8sObject, Keyed, Phase, Plan, Resource, WriterRecord
from reaper.policy import evaluate

NOW_DT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NOW = NOW_DT.timestamp()
M, H, D = 60, 3600, 86400
HB = "runner_manager_heartbeat"
_ids = itertools.count(1)


def settings(**overrides: object) -> Settings:
    """Settings from nested dicts, e.g. ``settings(gce={"slack": "2h"})``."""
    return parse_settings(overrides, "test")


def inst(
    name: str | None = None,
    project: str = "p1",
    status: str = "RUNNING",
    hb_age: float | None = None,
    hb: str | None = None,
    created_age: float = 1 * D,
    stop_age: float | None = None,
    labels: dict[str, str] | None = None,
    selector: bool = True,
    deletion_protection: bool = False,
    instance_id: str | None = None,
    group_member: bool = False,
) -> GceInstance:
    """An instance; ``hb_age`` sets a valid heartbeat that many seconds old, ``hb`` a raw label value."""
    n = next(_ids)
    all_labels = {"ci_ephemeral": "true"} if selector else {}
    if hb_age is not None:
        all_labels[HB] = str(int(NOW - hb_age))
    if hb is not None:
        all_labels[HB] = hb
    all_labels.update(labels or {})
    return GceInstance(
        project=project,
        zone="us-east1-b",
        name=name or f"vm-{n}",
        id=instance_id or str(1000 + n),
        status=status,
        labels=all_labels,
        created=NOW - created_age,
        last_stop=None if stop_age is None else NOW - stop_age,
        deletion_protection=deletion_protection,
        group_member=group_member,
    )


def group(manager: str = "m1", project: str = "p1", instances: int = 3, name: str | None = None) -> GceGroup:
    """A fleeting group named as ``FLEETING`` selects it (``fleeting-<manager>``)."""
    n = next(_ids)
    return GceGroup(project, "us-east1-b", name or f"fleeting-{manager}", str(5000 + n), instances)


FLEETING = "fleeting-(?P<manager>.+)"  # the gce.group_selector of the group tests


def healthy(*projects: str) -> list[WriterRecord]:
    return [WriterRecord(f"mgr-{p}", p, NOW - 60, False) for p in projects]


def obj(
    kind: str,
    run: str | None,
    age: float = 2 * H,
    namespace: str = "ci",
    cluster: str = "c1",
    labels: dict[str, str] | None = None,
    containers: dict[str, bool] | None = None,
    managed: bool = True,
    deleting: bool = False,
    name: str | None = None,
    uses: tuple[str, ...] = (),
    selects: tuple[tuple[str, str, tuple[str, ...]], ...] | None = None,
) -> K8sObject:
    n = next(_ids)
    all_labels = {"iterion.io/managed": "true"} if managed else {}
    if run is not None:
        all_labels["iterion.io/run-id"] = run
    all_labels.update(labels or {})
    return K8sObject(
        kind=kind,
        cluster=cluster,
        namespace=namespace,
        name=name or f"{kind.lower()}-{run}-{n}",
        uid=f"uid-{n}",
        labels=all_labels,
        created=NOW - age,
        containers=containers or {},
        deleting=deleting,
        uses=uses,
        selects=selects,
    )


def sandbox(run: str, age: float = 2 * H, **pod: object) -> list[K8sObject]:
    """A run's footprint: Pod, two Secrets, NetworkPolicy."""
    return [
        obj("Pod", run, age, **pod),  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name
        obj("Secret", run, age),
        obj("Secret", run, age),
        obj("NetworkPolicy", run, age),
    ]


def leases(held: list[str] | None = None, failed: list[str] | None = None) -> Keyed[float | None]:
    return Keyed(known=dict.fromkeys(held or []), failed=frozenset(failed or []), complete=True)


def runs(statuses: dict[str, str] | None = None, failed: list[str] | None = None, complete: bool = True) -> Keyed[str]:
    return Keyed(known=statuses or {}, failed=frozenset(failed or []), complete=complete)


def plan(
    resources: Sequence[Resource],
    evidence: Evidence | None = None,
    config: Settings | None = None,
    phase: Phase = Phase.ENFORCEMENT,
    **kwargs: object,
) -> Plan:
    if evidence is None:
        projects = {r.project for r in resources if isinstance(r, GceInstance)}
        evidence = Evidence(writer_health=healthy(*projects), leases=leases(), runs=runs())
    return evaluate(resources, evidence, config or settings(), phase, NOW_DT, **kwargs)  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name


def by_name(p: Plan) -> dict[str, tuple[str, str | None, str]]:
    """name -> (action, rule, reason)."""
    return {d.resource.name: (d.action.value, d.rule, d.reason) for d in p.decisions}
