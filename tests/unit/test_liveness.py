"""What each resource's liveness evidence says of its owner (``reaper.policy.liveness``), read by ``reaper diff``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from reaper.config import Settings
from reaper.model import Evidence, Keyed, Liveness, Reading, Resource, WriterRecord
from reaper.policy import liveness
from tests.builders import NOW, NOW_DT, D, H, M, healthy, inst, leases, obj, plan, runs, sandbox, settings

FRESH, UNKNOWN, STALE = Liveness.FRESH, Liveness.UNKNOWN, Liveness.STALE
ELSEWHERE = {"runner_heartbeat": str(int(NOW - M))}  # a manager stamping another label name


def read(
    resources: Sequence[Resource], evidence: Evidence | None = None, config: Settings | None = None
) -> dict[str, tuple[Liveness, str]]:
    """name -> (state, reason), the holds taken from a plan of the same config on the same input."""
    config = config or settings()
    evidence = evidence or Evidence(writer_health=healthy("p1"), leases=leases(), runs=runs())
    verdicts = plan(resources, evidence, config).scopes
    return {r.name: (x.state, x.reason) for _, r, x in liveness(resources, evidence, config, NOW_DT, verdicts)}


# --- GCE --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        (inst("v", hb_age=5 * M), (FRESH, "fresh")),
        (inst("v", hb_age=4 * H), (FRESH, "fresh")),  # at the quarantine: still fresh, as the rule reads it
        (inst("v", hb_age=5 * H), (STALE, "heartbeat_stale")),
        (inst("v", status="TERMINATED", hb_age=5 * M, stop_age=1 * H), (STALE, "terminated")),
        (inst("v", status="TERMINATED", hb_age=5 * M, stop_age=5 * M), (FRESH, "fresh")),  # within the grace
        (inst("v", created_age=1 * D), (UNKNOWN, "no_finding")),  # no label, younger than unlabeled_max_age
        (inst("v", created_age=4 * D), (STALE, "unlabeled_age")),
        (inst("v", hb="yesterday", created_age=1 * D), (UNKNOWN, "heartbeat_malformed")),
        (inst("v", hb="yesterday", created_age=4 * D), (STALE, "unlabeled_age")),
        (inst("v", hb_age=-1 * H), (UNKNOWN, "heartbeat_in_future")),
        (inst("v", hb_age=5 * H, created_age=-1 * H), (UNKNOWN, "created_in_future")),
        (inst("v", created_age=4 * D, labels=ELSEWHERE), (UNKNOWN, "heartbeat_elsewhere")),
        (inst("v", hb_age=5 * H, labels=ELSEWHERE), (UNKNOWN, "heartbeat_elsewhere")),
    ],
    ids=[
        "fresh",
        "at-quarantine",
        "stale",
        "terminated",
        "terminated-in-grace",
        "unlabeled-young",
        "unlabeled-old",
        "malformed-young",
        "malformed-old",
        "heartbeat-in-future",
        "created-in-future",
        "unlabeled-old-beating-elsewhere",
        "stale-beating-elsewhere",
    ],
)
def test_gce_readings(instance: Resource, expected: tuple[Liveness, str]) -> None:
    assert read([instance, inst("live", hb_age=M)])["v"] == expected  # beside a VM that carries the label


@pytest.mark.parametrize(
    ("writers", "expected"),
    [
        ([], "writer_health_unknown"),
        (None, "writer_health_unknown"),
        ([WriterRecord("m1", "p1", NOW - 60, True)], "writer_unhealthy"),
    ],
    ids=["no-series", "unreadable", "failing"],
)
def test_a_stale_heartbeat_under_a_writer_hold_is_no_proof(writers: list | None, expected: str) -> None:
    evidence = Evidence(writer_health=writers, leases=leases(), runs=runs())
    assert read([inst("v", hb_age=5 * H)], evidence)["v"] == (UNKNOWN, expected)


def test_a_stale_heartbeat_in_a_project_over_its_budget_is_no_proof() -> None:
    fleet = [inst(f"s{i}", hb_age=5 * H) for i in range(3)] + [inst("f", hb_age=5 * M)]
    readings = read(fleet)
    assert {readings[f"s{i}"] for i in range(3)} == {(UNKNOWN, "budget_exceeded")}
    assert readings["f"] == (FRESH, "fresh")


def test_the_reading_ignores_selector_opt_out_and_protection() -> None:
    # A config that stops selecting (or protecting) an instance must not change what its evidence says.
    config = settings(gce={"protected_projects": ["p1"]})
    fleet = [
        inst("unselected", hb_age=5 * M, selector=False),
        inst("opted", hb_age=5 * M, labels={"reaper_keep": "true"}),
        inst("stale", hb_age=5 * H),
    ]
    assert read(fleet, config=config) == {
        "unselected": (FRESH, "fresh"),
        "opted": (FRESH, "fresh"),
        "stale": (STALE, "heartbeat_stale"),
    }


def test_the_quarantine_is_the_configs() -> None:
    vm = inst("v", hb_age=3 * H)
    assert read([vm])["v"] == (FRESH, "fresh")
    assert read([vm], config=settings(gce={"max_job_timeout": "1h"}))["v"] == (STALE, "heartbeat_stale")


# --- Kubernetes -------------------------------------------------------------------------------


def _run(
    lease: Keyed | None, store: Keyed | None, run: str = "r1", config: Settings | None = None, **pod: Any
) -> tuple[Liveness, str]:
    objects = sandbox(run, **pod)
    readings = read(objects, Evidence(leases=lease, runs=store), config)
    assert len(set(readings.values())) == 1, "one reading per run"
    return readings[objects[0].name]


@pytest.mark.parametrize(
    ("lease", "store", "expected"),
    [
        (leases(["r1"]), runs({"r1": "succeeded"}), (FRESH, "lease_held")),
        (None, runs({"r1": "succeeded"}), (UNKNOWN, "lease_unknown")),
        (leases(failed=["r1"]), runs({"r1": "succeeded"}), (UNKNOWN, "lease_unknown")),
        (leases(), runs({"r1": "running"}), (FRESH, "lease_absent_run_active")),
        (leases(), None, (UNKNOWN, "store_unknown")),
        (leases(), runs(complete=False), (UNKNOWN, "store_unknown")),
        (leases(), runs({"r1": "failed"}), (STALE, "sandbox_orphan")),
        (leases(), runs(), (STALE, "sandbox_orphan")),  # provably not found
    ],
    ids=[
        "held",
        "lease-unreadable",
        "lease-failed",
        "run-active",
        "store-unreadable",
        "store-partial",
        "terminal",
        "gone",
    ],
)
def test_k8s_rows(lease: Keyed | None, store: Keyed | None, expected: tuple[Liveness, str]) -> None:
    assert _run(lease, store) == expected


def test_a_run_too_young_for_its_lease_to_count_is_unknown() -> None:
    assert _run(leases(), runs(), age=2 * M) == (UNKNOWN, "min_age")


def test_a_running_results_sidecar_is_alive() -> None:
    assert _run(leases(), runs(), containers={"runner": True, "results-egress": False}) == (
        FRESH,
        "results_egress_in_progress",
    )


def test_a_running_container_where_the_cluster_shows_no_sidecar_is_unknown() -> None:
    assert _run(leases(), runs(), containers={"runner": True, "results-uploader": False}) == (
        UNKNOWN,
        "results_sidecar_unseen",
    )


def test_results_not_proven_durable_are_unknown() -> None:
    config = settings(k8s={"step_store": "postgres"})
    objects = sandbox("r1", labels={"iterion.io/step": "build", "iterion.io/attempt": "1"})
    readings = read(objects, Evidence(leases=leases(), runs=runs(), steps=Keyed(complete=True)), config)
    assert readings[objects[0].name] == (UNKNOWN, "results_not_durable")


def test_a_run_whose_secret_a_pod_outside_it_uses_is_alive() -> None:
    objects = sandbox("r1")
    secret = objects[1].name
    user = obj("Pod", None, name="relabelled", uses=(secret,))
    readings = read([*objects, user], Evidence(leases=leases(), runs=runs()))
    assert readings[secret] == (FRESH, "in_use_outside_run")
    assert readings["relabelled"] == (UNKNOWN, "run_label_missing")


def test_an_opted_out_run_is_still_read() -> None:
    # The guards keep it under this config; a config without the guard must still see the evidence.
    objects = sandbox("r1", labels={"reaper.io/keep": "true"})
    assert read(objects, Evidence(leases=leases(["r1"]), runs=runs()))[objects[0].name] == (FRESH, "lease_held")


def test_orphans_in_a_cluster_over_its_budget_are_no_proof() -> None:
    objects = [o for r in ("r1", "r2", "r3") for o in sandbox(r)]
    readings = read(objects, Evidence(leases=leases(), runs=runs()))
    assert set(readings.values()) == {(UNKNOWN, "budget_exceeded")}


def test_a_reading_carries_its_facts() -> None:
    [(_, _, reading)] = liveness([inst("v", hb_age=5 * M)], Evidence(), settings(), NOW_DT, [])
    assert isinstance(reading, Reading) and reading.evidence["heartbeat_age_s"] == 5 * M


def test_no_label_where_no_vm_of_the_project_carries_it_is_no_proof() -> None:
    """A VM past the maximum age without the heartbeat label reads as stale, unless no VM of its project carries
    the label (heartbeat_label_unseen): then its absence proves nothing, and a diff that would delete it gates."""
    old = inst("v", created_age=4 * D)
    assert read([old])["v"] == (UNKNOWN, "heartbeat_label_unseen")
    assert read([old, inst("live", hb_age=M)])["v"] == (STALE, "unlabeled_age")
