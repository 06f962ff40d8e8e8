"""The comparison behind ``reaper diff`` (``reaper.diff``): which decisions change, and which changes are dangerous."""

from __future__ import annotations

from collections.abc import Iterable

from reaper.config import Settings
from reaper.diff import ConfigDiff, diff
from reaper.model import Evidence, Liveness, Phase, Resource
from tests.builders import NOW_DT, D, H, M, healthy, inst, leases, runs, sandbox, settings

ENFORCE = {"rollout": {"gce": "enforcement", "k8s": "enforcement"}}


def cfg(**overrides: object) -> Settings:
    """A config in enforcement for both targets, with ``overrides`` merged into its sections."""
    return settings(**{**ENFORCE, **overrides})


def run_diff(
    resources: Iterable[Resource],
    old: Settings,
    new: Settings,
    evidence: Evidence | None = None,
    phase: Phase | None = None,
) -> ConfigDiff:
    evidence = evidence or Evidence(writer_health=healthy("p1"), leases=leases(), runs=runs())
    return diff(resources, evidence, old, new, phase, NOW_DT)


def changed(result: ConfigDiff) -> dict[str, tuple[str | None, str | None, bool]]:
    """name -> (old action, new action, dangerous)."""
    return {
        c.resource.name: (c.old.action.value if c.old else None, c.new.action.value if c.new else None, c.dangerous)
        for c in result.changes
    }


def test_identical_configs_change_nothing() -> None:
    fleet: list[Resource] = [inst("fresh", hb_age=5 * M), inst("stale", hb_age=5 * H), *sandbox("r1")]
    assert run_diff(fleet, cfg(), cfg()).changes == []


def test_a_shorter_quarantine_that_deletes_a_fresh_vm_is_dangerous() -> None:
    fleet = [inst("fresh", hb_age=2 * H), inst("young", hb_age=5 * M), inst("stale", hb_age=5 * H)]
    result = run_diff(fleet, cfg(), cfg(gce={"max_job_timeout": "30m", "slack": "30m"}))
    assert changed(result) == {"fresh": ("keep", "delete", True)}
    [change] = result.dangerous
    # The old config read its heartbeat as fresh: that reading counts, though the new one calls it stale.
    assert (change.liveness.state, change.liveness.reason, change.read_by) == (Liveness.FRESH, "fresh", "old")
    assert change.new.reason == "heartbeat_stale"


def test_enabling_a_rule_on_stale_vms_is_listed_but_not_dangerous() -> None:
    fleet = [inst("fresh", hb_age=5 * M), inst("stale", hb_age=5 * H)]
    result = run_diff(fleet, cfg(rules={"heartbeat_stale": "report"}), cfg())
    assert changed(result) == {"stale": ("report", "delete", False)}
    assert result.changes[0].widens and result.dangerous == []


def test_deleting_an_unlabeled_vm_before_the_old_maximum_age_is_dangerous() -> None:
    # No heartbeat and younger than the old unlabeled_max_age: no evidence either way, so it gates.
    # (Beside a heartbeated VM: the project's managers stamp the label, so its absence is evidence.)
    fleet = [inst("unlabeled", created_age=1 * D), inst("old-unlabeled", created_age=4 * D), inst("live", hb_age=60)]
    result = run_diff(fleet, cfg(rules={"unlabeled_age": "report"}), cfg(gce={"unlabeled_max_age": "5h"}))
    assert changed(result) == {"unlabeled": ("keep", "delete", True), "old-unlabeled": ("report", "delete", False)}
    assert result.dangerous[0].liveness.reason == "no_finding"


def test_keeping_more_is_listed_and_never_dangerous() -> None:
    fleet = [inst("stale", hb_age=5 * H)]
    result = run_diff(fleet, cfg(), cfg(gce={"protected_projects": ["p1"]}))
    assert changed(result) == {"stale": ("delete", "keep", False)}
    assert not result.changes[0].widens


def test_a_resource_the_old_config_did_not_select_counts_as_kept() -> None:
    fleet = [inst("other", hb_age=5 * M, selector=False, labels={"pool": "ci"})]
    result = run_diff(
        fleet, cfg(), cfg(gce={"selector": {"pool": "ci"}, "max_job_timeout": "1m", "slack": "1m"}), phase=None
    )
    assert changed(result) == {"other": (None, "delete", True)}


def test_a_delete_the_cap_reports_still_counts_as_a_delete() -> None:
    # The cap is a circuit breaker a manual max_deletions lifts: hiding a dangerous change behind it would not do.
    fleet = [inst("fresh", hb_age=2 * H)]
    new = cfg(gce={"max_job_timeout": "30m", "slack": "30m"}, max_deletions_per_sweep=0)
    result = run_diff(fleet, cfg(), new)
    assert changed(result) == {"fresh": ("keep", "report", True)}
    assert result.new.capped == {"gce": 1} and result.changes[0].new.reason == "max_deletions_exceeded"


def test_a_rollout_step_is_a_change_in_the_active_phase() -> None:
    fleet = [inst("fresh", hb_age=5 * M), inst("stale", hb_age=5 * H)]
    old = settings(rollout={"gce": "report-only"})
    result = run_diff(fleet, old, cfg())
    assert (result.old.phases["gce"], result.new.phases["gce"]) == (Phase.REPORT_ONLY, Phase.ENFORCEMENT)
    assert changed(result) == {"stale": ("report", "delete", False)}
    # Pinned to one phase, the same two configs decide alike.
    assert run_diff(fleet, old, cfg(), phase=Phase.ENFORCEMENT).changes == []


def test_each_target_is_evaluated_in_its_own_phase() -> None:
    fleet: list[Resource] = [inst("stale", hb_age=5 * H), *sandbox("r1")]
    old = settings(rollout={"gce": "enforcement", "k8s": "report-only"})
    new = settings(rollout={"gce": "report-only", "k8s": "enforcement"})
    result = run_diff(fleet, old, new)
    assert {c.target: (c.old.action.value, c.new.action.value) for c in result.changes} == {
        "gce": ("delete", "report"),
        "k8s": ("report", "delete"),
    }
    assert len(result.changes) == 5 and result.dangerous == []  # one VM, four objects of an orphaned run


def test_a_shorter_min_age_that_deletes_a_young_run_is_dangerous() -> None:
    # Too young for its lease to count under the old config: unknown, though the new one calls it an orphan.
    objects = sandbox("r1", age=3 * M)
    result = run_diff(objects, cfg(), cfg(k8s={"min_age": "1m"}), Evidence(leases=leases(), runs=runs()))
    assert {c.dangerous for c in result.changes} == {True} and len(result.changes) == 4
    assert {(c.liveness.state, c.liveness.reason, c.read_by) for c in result.changes} == {
        (Liveness.UNKNOWN, "min_age", "old")
    }


def test_a_run_holding_its_lease_is_never_deleted_by_either_config() -> None:
    # The lease is read first whatever the config: no config change deletes it, so nothing changes.
    objects = sandbox("r1")
    evidence = Evidence(leases=leases(["r1"]), runs=runs({"r1": "failed"}))
    assert run_diff(objects, cfg(), cfg(k8s={"min_age": "1m"}), evidence).changes == []


def test_dangerous_changes_come_first() -> None:
    fleet = [inst("a-stale", hb_age=5 * H), inst("z-fresh", hb_age=2 * H)]
    old = cfg(rules={"heartbeat_stale": "report"})
    result = run_diff(fleet, old, cfg(gce={"max_job_timeout": "30m", "slack": "30m"}, budget={"min_stale": 3}))
    assert [(c.resource.name, c.dangerous) for c in result.changes] == [("z-fresh", True), ("a-stale", False)]


# --- review findings: what kept a resource whatever its evidence, and what the old selection never took in -----


def test_renaming_an_opt_out_label_that_deletes_an_opted_out_vm_is_dangerous() -> None:
    fleet = [inst("kept-by-human", hb_age=5 * H, labels={"reaper_keep": "true"})]
    result = run_diff(fleet, cfg(), cfg(gce={"opt_out_label": "reaper_do_not_reap=true"}))
    assert changed(result) == {"kept-by-human": ("keep", "delete", True)}  # stale, but a person said keep


def test_dropping_a_kubernetes_opt_out_or_a_protected_namespace_is_dangerous() -> None:
    ev = Evidence(leases=leases(), runs=runs({"r1": "succeeded"}))
    opted = sandbox("r1", labels={"reaper.io/keep": "true"})
    assert run_diff(opted, cfg(), cfg(k8s={"opt_out_label": "reaper.io/hold=true"}), ev).dangerous
    protected = sandbox("r1", namespace="kube-system")
    assert run_diff(protected, cfg(), cfg(k8s={"protected_namespaces": []}), ev).dangerous


def test_a_wider_selector_that_deletes_vms_no_manager_owned_is_dangerous_but_a_stale_heartbeat_is_proof() -> None:
    # TERMINATED and "no heartbeat label and old" prove a runner manager's VM gone, not a bastion's.
    fleet = [
        inst("bastion", created_age=30 * D, selector=False, labels={"env": "ci"}),
        inst("stopped-dev-vm", status="TERMINATED", stop_age=2 * D, selector=False, labels={"env": "ci"}),
        inst("stale-runner", hb_age=5 * H, selector=False, labels={"env": "ci"}),
        inst("live-runner", hb_age=M, selector=False, labels={"env": "ci"}),  # its manager stamps the label now
    ]
    result = run_diff(fleet, cfg(), cfg(gce={"selector": {"env": "ci"}}))
    assert changed(result) == {
        "bastion": (None, "delete", True),
        "stopped-dev-vm": (None, "delete", True),
        "stale-runner": (None, "delete", False),  # its manager's heartbeat label, stale: proof
        "live-runner": (None, "keep", False),
    }


def test_a_recorded_input_cannot_show_what_a_wider_selection_takes_in() -> None:
    from reaper.diff import unlisted

    assert unlisted(cfg(), cfg()) == []
    assert unlisted(cfg(), cfg(gce={"selector": {"ci_ephemeral": "true", "pool": "a"}})) == []  # narrower
    wider = unlisted(cfg(), cfg(gce={"selector": {"env": "ci"}}, k8s={"clusters": ["kubernetes_default", "c2"]}))
    assert [w.split(":")[0] for w in wider] == ["gce.selector", "k8s.clusters"]
    assert unlisted(cfg(k8s={"namespaces": ["ci"]}), cfg())[0].startswith("k8s.namespaces: all")
    recorded = diff([], Evidence(), cfg(), cfg(gce={"selector": {"env": "ci"}}), None, NOW_DT, recorded=True)
    assert recorded.changes == [] and recorded.fails  # no change seen, and still no pass


def test_an_old_opt_out_on_a_resource_the_old_config_did_not_select_still_fails() -> None:
    # Second review: a wider selector that also renames the opt-out deleted opted-out resources with exit 0.
    vm = inst("kept-by-human", hb_age=5 * H, selector=False, labels={"env": "ci", "reaper_keep": "true"})
    wider = cfg(gce={"selector": {"env": "ci"}, "opt_out_label": "reaper_do_not_reap=true"})
    assert changed(run_diff([vm], cfg(), wider)) == {"kept-by-human": (None, "delete", True)}
    objects = [o for o in sandbox("r1", labels={"reaper.io/keep": "true", "team": "ci"})]
    ev = Evidence(leases=leases(), runs=runs({"r1": "succeeded"}))
    moved = cfg(k8s={"selector": {"team": "ci"}, "opt_out_label": "reaper.io/hold=true"})
    result = run_diff([o for o in objects if o.kind == "Pod"], cfg(k8s={"selector": {"team": "none"}}), moved, ev)
    assert result.dangerous and result.dangerous[0].old is None and result.dangerous[0].old_guard == "opt_out"
