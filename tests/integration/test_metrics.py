"""Sweep metrics pushed to a real Pushgateway (Debian's prometheus-pushgateway): grouped by target and
scope so the alerts follow the active phase, last-sweep gauges, stale groups retired; a failed push
fails nothing."""

from __future__ import annotations

import io
import json

import msgspec
import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge, push_to_gateway
from prometheus_client.exposition import delete_from_gateway

from include.emulators.http import free_port
from reaper import metrics
from reaper.cli import main
from reaper.metrics import PushedSweep, push_sweep, retire
from reaper.model import Phase
from reaper.records import PlanRef, SweepSummary, summary_of
from reaper.sweep.overrides import Overrides
from reaper.sweep.steps import Summary, SweepInput, summarize
from tests.builders import D, M, inst, plan, settings

NONE = Overrides(budget=None, max_deletions=500, record=None)  # a sweep on the configured cap, no override


def _as_ledger_holds(summary: Summary) -> SweepSummary:
    """The plan's summary as the ledger's summary document holds it, typed."""
    return summary_of({"dag_id": "reaper_gce_enforcement", "run_id": "r", **msgspec.to_builtins(summary)})


def _summary(phase: Phase = Phase.ENFORCEMENT) -> SweepSummary:
    fleet = [inst(hb_age=M), inst(hb_age=D), inst(hb_age=D), inst(hb_age=D), inst(hb_age=M, project="p2")]
    fleet.append(inst(status="TERMINATED", stop_age=D, hb_age=M, project="p2"))
    read = SweepInput(path="", as_of=0.0, tokens=["t"], incomplete={}, hygiene={}, warnings=[])
    made = PlanRef(0, "t", "c")
    return _as_ledger_holds(summarize(plan(fleet, phase=phase), made, read, NONE, 0, "sre", False, False))


def _sweep(phase: Phase = Phase.ENFORCEMENT, **changes: object) -> PushedSweep:
    deleting = {"enforcement": ["terminated", "heartbeat_stale", "unlabeled_age"], "report-only": ["terminated"]}
    fields: dict[str, object] = {
        "target": "gce",
        "summary": _summary(phase),
        "outcomes": {"deleted": 1},
        "deleting": deleting.get(phase.value, []),
        "full": True,
        "completed": True,
        "started_at": 1.8e9 - 42,
        "finished_at": 1.8e9,
    }
    return PushedSweep(**{**fields, **changes})  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name


def _lines(url: str) -> list[str]:
    return [line for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines() if line.startswith("reaper_")]


def _value(lines: list[str], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    matches = [line for line in lines if line.startswith(name + "{") and all(w in line for w in want)]
    assert len(matches) == 1, (name, labels, matches)
    return float(matches[0].rsplit(" ", 1)[1])


def _groups(url: str) -> set[tuple[tuple[str, str], ...]]:
    data = requests.get(f"{url}/api/v1/metrics", timeout=5).json()["data"]
    return {tuple(sorted((k, v) for k, v in g["labels"].items() if k != "job")) for g in data}


def test_a_sweep_pushes_per_target_and_scope_groups_of_last_sweep_gauges(pushgateway) -> None:
    assert push_sweep(pushgateway.url, _sweep(), 5, ["p1", "p2"]) == 0
    lines = _lines(pushgateway.url)
    assert not any("dag_id=" in line for line in lines)  # grouped by target: the alerts follow the active phase
    p1 = {"target": "gce", "scope": "p1"}
    assert _value(lines, "reaper_scope_hold", **p1, hold="budget_exceeded", blocks_deletes="true") == 1
    assert _value(lines, "reaper_last_sweep_findings", **p1, finding="heartbeat_stale") == 3
    assert _value(lines, "reaper_last_sweep_held_orphans", **p1) == 3  # the budget held them
    assert _value(lines, "reaper_last_sweep_heartbeat_ages", **p1, le="+Inf") == 4
    assert _value(lines, "reaper_last_sweep_resources", **p1, status="RUNNING") == 4
    assert "# TYPE reaper_last_sweep_heartbeat_ages gauge" in requests.get(f"{pushgateway.url}/metrics", timeout=5).text
    everything = {"target": "gce", "scope": "_all"}
    assert _value(lines, "reaper_last_success_timestamp_seconds", **everything) == 1.8e9
    assert _value(lines, "reaper_last_sweep_deletions", **everything, outcome="deleted") == 1
    assert _value(lines, "reaper_last_sweep_deletions", **everything, outcome="failed") == 0
    assert _value(lines, "reaper_last_sweep_capped", **everything) == 0
    assert _value(lines, "reaper_last_sweep_push_failures", **everything) == 0
    assert _value(lines, "reaper_last_sweep_retire_failures", **everything) == 0
    attempt = {"target": "gce", "scope": "_attempt"}
    assert _value(lines, "reaper_last_sweep_duration_seconds", **attempt) == 42
    assert _value(lines, "reaper_last_attempt_timestamp_seconds", **attempt) == 1.8e9


def test_a_hold_on_a_rule_that_only_reports_does_not_block(pushgateway) -> None:
    assert push_sweep(pushgateway.url, _sweep(Phase.REPORT_ONLY), 5, ["p1", "p2"]) == 0
    lines = _lines(pushgateway.url)
    p1 = {"target": "gce", "scope": "p1"}
    assert _value(lines, "reaper_scope_hold", **p1, hold="budget_exceeded", blocks_deletes="false") == 1
    assert _value(lines, "reaper_last_sweep_held_orphans", **p1) == 0  # reporting is what this phase does


def test_the_cap_is_exported_and_what_it_held_counts_as_held_orphans(pushgateway) -> None:
    fleet = [inst(status="TERMINATED", stop_age=D, hb_age=M, project="p1") for _ in range(3)]
    read = SweepInput(path="", as_of=0.0, tokens=["t"], incomplete={}, hygiene={}, warnings=[])
    capped = plan(fleet, config=settings(max_deletions_per_sweep=2, gce={"projects": ["p1"]}))
    summary = _as_ledger_holds(summarize(capped, PlanRef(0, "t", "c"), read, NONE, 0, "sre", False, False))
    assert push_sweep(pushgateway.url, _sweep(summary=summary, outcomes={}), 5, ["p1"]) == 0
    lines = _lines(pushgateway.url)
    assert _value(lines, "reaper_last_sweep_capped", target="gce", scope="_all") == 1
    assert _value(lines, "reaper_last_sweep_held_orphans", target="gce", scope="p1") == 3


def test_a_partial_or_failed_sweep_never_refreshes_the_last_success(pushgateway) -> None:
    assert push_sweep(pushgateway.url, _sweep(full=False), 5, ["p1", "p2", "p3"]) == 0
    lines = _lines(pushgateway.url)
    assert not any(line.startswith("reaper_last_success_timestamp_seconds") for line in lines)
    assert _value(lines, "reaper_last_sweep_findings", target="gce", scope="p1", finding="heartbeat_stale") == 3
    assert push_sweep(pushgateway.url, _sweep(finished_at=1.9e9), 5, ["p1", "p2"]) == 0
    assert push_sweep(pushgateway.url, _sweep(completed=False, finished_at=2.0e9), 5, ["p1", "p2"]) == 0
    lines = _lines(pushgateway.url)
    assert _value(lines, "reaper_last_success_timestamp_seconds", target="gce", scope="_all") == 1.9e9
    assert _value(lines, "reaper_last_attempt_timestamp_seconds", target="gce", scope="_attempt") == 2.0e9


def _group(url: str, grouping: dict[str, str]) -> None:
    """A group an earlier sweep pushed: of a scope since removed, or of the DAG-grouped layout before this one."""
    registry = CollectorRegistry()
    Gauge("reaper_budget_hold", "old", ["target"], registry=registry).labels("gce").set(1)
    push_to_gateway(url, job="reaper", grouping_key=grouping, registry=registry)


def test_a_full_sweep_retires_removed_scopes_and_the_dag_grouped_layout(pushgateway) -> None:
    _group(pushgateway.url, {"target": "gce", "scope": "gone"})  # a project since removed from gce.projects
    _group(pushgateway.url, {"dag_id": "reaper_gce_report_only", "scope": "p1"})  # a phase paused, old layout
    _group(pushgateway.url, {"dag_id": "reaper_k8s_enforcement", "scope": "c1"})  # another target's
    assert push_sweep(pushgateway.url, _sweep(full=False), 5, ["p1", "p2"]) == 0
    assert (("scope", "gone"), ("target", "gce")) in _groups(pushgateway.url)  # only a full sweep retires
    assert push_sweep(pushgateway.url, _sweep(), 5, ["p1", "p2"]) == 0
    groups = _groups(pushgateway.url)
    assert (("scope", "gone"), ("target", "gce")) not in groups
    assert (("dag_id", "reaper_gce_report_only"), ("scope", "p1")) not in groups
    assert (("dag_id", "reaper_k8s_enforcement"), ("scope", "c1")) in groups
    assert {(("scope", s), ("target", "gce")) for s in ("p1", "p2", "_all", "_attempt")} <= groups


def test_metrics_retire_deletes_a_disabled_targets_groups_by_hand(pushgateway, tmp_path) -> None:
    push_sweep(pushgateway.url, _sweep(), 5, ["p1", "p2"])
    config = tmp_path / "reaper.yaml"
    config.write_text(json.dumps({"metrics": {"pushgateway_url": pushgateway.url}, "gce": {"projects": ["p1"]}}))
    out = io.StringIO()
    assert main(["metrics-retire", "--config", str(config), "--target", "gce", "--scope", "p2"], out) == 0
    assert out.getvalue() == "scope=p2 target=gce\n"
    assert main(["metrics-retire", "--config", str(config), "--target", "gce"], out) == 0
    assert not any(dict(g).get("target") == "gce" for g in _groups(pushgateway.url))
    assert retire(pushgateway.url, "gce", 5).gone == []


def test_metrics_retire_without_a_pushgateway_is_a_clear_error(tmp_path, capsys) -> None:
    config = tmp_path / "reaper.yaml"
    config.write_text("gce: {projects: [p1]}\n")
    assert main(["metrics-retire", "--config", str(config), "--target", "gce"]) == 2
    assert "metrics.pushgateway_url is empty" in capsys.readouterr().err


@pytest.mark.parametrize("completed", [True, False])
def test_a_failed_push_is_counted_not_raised(completed: bool, caplog) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    # 2 scopes + _all + the retirement + _attempt; a failed sweep pushes its attempt only.
    assert push_sweep(url, _sweep(completed=completed), 1, ["p1", "p2"]) == (5 if completed else 1)
    # Not even the count of failed pushes arrived: the log says so, at ERROR.
    assert [r.levelname for r in caplog.records if "every metrics push" in r.getMessage()] == ["ERROR"]


def test_a_group_the_retirement_cannot_delete_is_counted_in_the_sweeps_own_group(pushgateway, monkeypatch) -> None:
    """A removed project's group that stays pages on its last values; the sweep says so in _all
    (ReaperMetricsRetireFailing), and tries every other group all the same."""
    for scope in ("gone-a", "gone-b"):
        _group(pushgateway.url, {"target": "gce", "scope": scope})
    real = delete_from_gateway  # what reaper.metrics calls

    def refuse_gone_a(url: str, job: str, grouping_key: dict[str, str], timeout: float) -> None:
        if grouping_key.get("scope") == "gone-a":
            raise OSError("HTTP Error 405: Method Not Allowed")  # a proxy in front that refuses DELETE
        real(url, job=job, grouping_key=grouping_key, timeout=timeout)

    monkeypatch.setattr(metrics, "delete_from_gateway", refuse_gone_a)
    assert push_sweep(pushgateway.url, _sweep(), 5, ["p1", "p2"]) == 1
    groups = _groups(pushgateway.url)
    assert (("scope", "gone-a"), ("target", "gce")) in groups and (("scope", "gone-b"), ("target", "gce")) not in groups
    assert _value(_lines(pushgateway.url), "reaper_last_sweep_retire_failures", target="gce", scope="_all") == 1
    assert _value(_lines(pushgateway.url), "reaper_last_sweep_push_failures", target="gce", scope="_all") == 0


def test_metrics_retire_names_a_group_it_could_not_delete_and_fails(pushgateway, tmp_path, monkeypatch, capsys) -> None:
    _group(pushgateway.url, {"target": "gce", "scope": "gone-a"})

    def refuse(url: str, job: str, grouping_key: dict[str, str], timeout: float) -> None:
        raise OSError("HTTP Error 405: Method Not Allowed")

    monkeypatch.setattr(metrics, "delete_from_gateway", refuse)
    config = tmp_path / "reaper.yaml"
    config.write_text(json.dumps({"metrics": {"pushgateway_url": pushgateway.url}, "gce": {"projects": ["p1"]}}))
    assert main(["metrics-retire", "--config", str(config), "--target", "gce"], io.StringIO()) == 1
    assert "could not delete the group scope=gone-a target=gce" in capsys.readouterr().err


def test_a_listing_that_fails_counts_one_retire_failure() -> None:
    assert metrics._retire_stale(f"http://127.0.0.1:{free_port()}", "gce", 1, ["p1"]) == 1


def test_the_pushgateway_stamps_each_group_with_its_push_time(pushgateway) -> None:
    """The alerts tell a stale scope group (one the last full sweep did not push: a removed project whose
    retirement failed) by the Pushgateway's own push_time_seconds, labelled with the grouping key."""
    assert push_sweep(pushgateway.url, _sweep(), 5, ["p1", "p2"]) == 0
    text = requests.get(f"{pushgateway.url}/metrics", timeout=5).text
    stamps = [line for line in text.splitlines() if line.startswith("push_time_seconds{")]
    for scope in ("p1", "p2", "_all", "_attempt"):
        assert any(f'scope="{scope}"' in line and 'job="reaper"' in line and 'target="gce"' in line for line in stamps)
