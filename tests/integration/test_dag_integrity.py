"""Every file in dags/ imports cleanly under Airflow's own DagBag, with the conventions the project keeps."""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
SWEEPS = {
    "reaper_gce_telemetry",
    "reaper_gce_terminated_cleanup",
    "reaper_gce_report_only",
    "reaper_gce_enforcement",
    "reaper_k8s_telemetry",
    "reaper_k8s_report_only",
    "reaper_k8s_enforcement",
}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    # Airflow 3.3.2: DagBag has no include_examples argument; examples are off via AIRFLOW__CORE__LOAD_EXAMPLES.
    return DagBag(dag_folder=str(DAGS))


def test_every_dag_file_imports_without_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == SWEEPS | {"reaper_config_check"}


def test_every_dag_file_is_parsed(dagbag) -> None:
    files = {Path(dag.fileloc).name for dag in dagbag.dags.values()}
    assert files == {p.name for p in DAGS.glob("*.py")}


def test_dags_are_tagged_and_do_not_catch_up(dagbag) -> None:
    for dag in dagbag.dags.values():
        assert "reaper" in dag.tags
        assert dag.catchup is False


def test_sweep_dag_conventions(dagbag) -> None:
    for dag_id in SWEEPS:
        dag = dagbag.dags[dag_id]
        assert dag.max_active_runs == 1
        assert (
            dag.dagrun_timeout < dag.timetable.summary_interval
            if hasattr(dag.timetable, "summary_interval")
            else dag.dagrun_timeout.total_seconds() > 0
        )
        tasks = {t.task_id: t for t in dag.tasks}
        assert list(tasks) == [
            "resolve_scopes",
            "list_inventory",
            "gather_evidence",
            "evaluate_policy",
            "budget_check",
            "delete",
            "report_only",
            "record",
            "release_lease",
        ]
        assert tasks["resolve_scopes"].is_setup and tasks["release_lease"].is_teardown
        assert all(t.retries >= 1 and t.retry_exponential_backoff for t in dag.tasks)
        assert tasks["delete"].pool == f"reaper_{dag_id.split('_')[1]}"
        assert ("override_budget" in dag.params) == ("telemetry" not in dag_id)


def form_requires(schema: dict) -> bool:
    """Whether Airflow's Trigger form marks a Param required, as its ``isRequired`` does: a schema type
    without "null" (airflow-core/src/airflow/ui/src/components/FlexibleForm/isParamRequired.tsx). The form
    keeps the Trigger button disabled while a required field holds null or "" (FlexibleForm.tsx), and a
    cleared text or list field sends null (FieldStringArray.tsx, FieldMultiSelect.tsx)."""
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def test_the_trigger_form_asks_nothing_of_a_plain_run(dagbag) -> None:
    # Override_reason ("" as a required string) kept the Trigger button disabled.
    from copy import copy

    for dag_id in SWEEPS:
        params = dagbag.dags[dag_id].params
        for name in params:
            param = params.get_param(name)
            assert not (form_requires(param.schema) and param.value in (None, "")), (dag_id, name)
            if param.schema.get("type") != "boolean":  # a check box is never empty
                assert not form_requires(param.schema), (dag_id, name)
                assert copy(param).resolve(None) is None, (dag_id, name)  # what a cleared field sends
        assert {"dry_run", "scopes"} <= set(params), dag_id
        if "telemetry" not in dag_id:
            assert {"override_budget", "override_scopes", "override_reason", "max_deletions"} <= set(params)
            assert params.get_param("override_scopes").resolve(["p1"]) == ["p1"]


def test_schedules_and_timeouts(dagbag) -> None:
    gce, k8s = dagbag.dags["reaper_gce_enforcement"], dagbag.dags["reaper_k8s_enforcement"]
    assert gce.dagrun_timeout.total_seconds() == 540 and k8s.dagrun_timeout.total_seconds() == 54


def bag_with_config(text: str, tmp_path, monkeypatch):
    """The DAG folder parsed with this reaper config."""
    from airflow.dag_processing.dagbag import DagBag

    config = tmp_path / "reaper.yaml"
    config.write_text(text)
    monkeypatch.setenv("REAPER_CONFIG", str(config))
    return DagBag(dag_folder=str(DAGS))


def test_a_disabled_target_has_no_dags(tmp_path, monkeypatch) -> None:
    bag = bag_with_config("k8s: {enabled: false}\nairflow: {gce_schedule: 0}\n", tmp_path, monkeypatch)
    assert not any(d.startswith("reaper_k8s_") for d in bag.dags)
    assert bag.dags["reaper_gce_enforcement"].schedule is None  # 0: manual triggers only


def test_only_the_active_phase_runs_on_the_schedule(tmp_path, monkeypatch) -> None:
    bag = bag_with_config("rollout: {gce: report-only}\n", tmp_path, monkeypatch)
    scheduled = {d: dag.schedule for d, dag in bag.dags.items() if d.startswith("reaper_") and dag.schedule}
    assert set(scheduled) == {"reaper_gce_report_only", "reaper_k8s_telemetry"}  # k8s: the default, telemetry
    assert str(scheduled["reaper_gce_report_only"]) == str(timedelta(minutes=10))
    assert bag.dags["reaper_gce_enforcement"].schedule is None  # there for manual triggers
    # Another phase than the active one deletes only when its trigger confirms it (docs/design.md §8): the form asks
    # there. Telemetry deletes nothing and asks nothing.
    gated = {d for d, dag in bag.dags.items() if "confirm_phase" in dag.params}
    assert gated == {
        "reaper_gce_terminated_cleanup",
        "reaper_gce_enforcement",
        "reaper_k8s_report_only",
        "reaper_k8s_enforcement",
    }
    assert "report-only" in bag.dags["reaper_gce_enforcement"].params.get_param("confirm_phase").description


def test_a_phase_a_target_does_not_have_is_refused_naming_the_key(tmp_path, monkeypatch) -> None:
    bag = bag_with_config("rollout: {k8s: terminated-cleanup}\n", tmp_path, monkeypatch)
    assert bag.import_errors and all("rollout.k8s" in err for err in bag.import_errors.values())


def test_invalid_config_is_an_import_error_naming_the_key(tmp_path, monkeypatch) -> None:
    bag = bag_with_config("budget: {max_stale_fraction: 3}\n", tmp_path, monkeypatch)
    assert not any(d.startswith("reaper_gce_") for d in bag.dags)
    assert all("budget.max_stale_fraction" in err for err in bag.import_errors.values()) and bag.import_errors


def test_parsing_does_no_network_io_and_is_fast(monkeypatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a DAG file opened a network connection at parse time")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    for path in sorted(DAGS.glob("reaper_*.py")):
        started = time.perf_counter()
        bag = DagBag(dag_folder=str(path))
        elapsed = time.perf_counter() - started
        assert bag.import_errors == {}, bag.import_errors
        # A bound against a DAG file that imports the SDKs or does I/O at parse time (seconds), loose enough for a
        # loaded machine (0.79 s seen beside the e2e tests): the parse time itself is measured in docs/benchmarks.md.
        assert elapsed < 2.0, f"{path.name} took {elapsed:.2f}s to parse"


def test_failures_raise_an_alert(dagbag, caplog) -> None:
    from airflow.sdk import Context

    from reaper.sweep.alerts import LogNotifier

    dag = dagbag.dags["reaper_gce_enforcement"]
    assert any(isinstance(n, LogNotifier) for n in dag.on_failure_callback)
    assert all(any(isinstance(n, LogNotifier) for n in t.on_failure_callback) for t in dag.tasks)

    class Run:
        dag_id, run_id = "reaper_gce_enforcement", "manual__1"

    class Ti:
        task_id = "delete"

    caplog.set_level("ERROR", logger="reaper.alerts")
    # Stand-ins with the only attributes the notifier reads, not Airflow's run and task instance.
    LogNotifier().notify(cast(Context, {"dag_run": Run(), "ti": Ti(), "exception": RuntimeError("quota exceeded")}))
    assert "dag=reaper_gce_enforcement run=manual__1 task=delete error=quota exceeded" in caplog.text


def test_email_alerts_when_configured(tmp_path, monkeypatch) -> None:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    bag = bag_with_config("airflow: {alerts: {email: [oncall@example.org]}}\n", tmp_path, monkeypatch)
    dag = bag.dags["reaper_k8s_enforcement"]
    assert any(isinstance(n, SmtpNotifier) for n in dag.on_failure_callback)


def test_pools_file_defines_each_targets_pool(dagbag) -> None:
    import json

    pools = json.loads((DAGS.parent / "include" / "airflow" / "pools.json").read_text())
    used = {t.pool for d in dagbag.dags.values() for t in d.tasks if t.pool != "default_pool"}
    assert used == set(pools) == {"reaper_gce", "reaper_k8s"}


def config_check(dagbag, monkeypatch, tmp_path, text: str):
    """What ``reaper_config_check`` returns for this config (its log lines go to caplog)."""
    config = tmp_path / "reaper.yaml"
    config.write_text(text)
    monkeypatch.setenv("REAPER_CONFIG", str(config))
    return dagbag.dags["reaper_config_check"].get_task("check_config").python_callable()


@pytest.mark.parametrize(("step_store", "warned"), [("none", True), ("postgres", False)])
def test_config_check_says_loudly_when_step_results_are_not_guarded(
    dagbag, caplog, monkeypatch, tmp_path, step_store: str, warned: bool
) -> None:
    # With k8s.step_store none, step pods are reaped without any durability check.
    caplog.set_level(logging.WARNING)
    modes = config_check(dagbag, monkeypatch, tmp_path, f"k8s:\n  step_store: {step_store}\n")
    assert modes["enforcement"]["sandbox_orphan"] == "delete"
    assert ("NOT checked for durability" in caplog.text) is warned


@pytest.mark.parametrize(("url", "warned"), [("", True), ("http://127.0.0.1:9091", False)])
def test_config_check_says_loudly_when_no_metrics_reach_the_alerts(
    dagbag, caplog, monkeypatch, tmp_path, url: str, warned: bool
) -> None:
    caplog.set_level(logging.INFO)
    config_check(
        dagbag, monkeypatch, tmp_path, f"metrics: {{pushgateway_url: '{url}'}}\nrollout: {{gce: report-only}}\n"
    )
    assert ("metrics.pushgateway_url is empty" in caplog.text) is warned
    assert "gce: active phase report-only (rollout.gce)" in caplog.text
    assert "k8s: active phase telemetry (rollout.k8s)" in caplog.text


@pytest.mark.parametrize("executor", ["CeleryExecutor", "LocalExecutor,KubernetesExecutor"])
def test_a_local_sweep_store_with_a_distributed_executor_is_refused(executor: str, tmp_path, monkeypatch) -> None:
    """Workers on other machines would not find each other's inventory files: refused at parse time."""
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    bag = bag_with_config("airflow: {sweep_store: 'file:///tmp/reaper-sweeps'}\n", tmp_path, monkeypatch)
    assert not any(d.startswith(("reaper_gce_", "reaper_k8s_")) for d in bag.dags)
    errors = list(bag.import_errors.values())
    assert len(errors) == 2 and all("airflow.sweep_store: file:///tmp/reaper-sweeps" in e for e in errors)
    assert all("expected an object store every worker reaches" in e for e in errors)
    shared = bag_with_config("airflow: {sweep_store: 'gs://reaper-sweeps/x'}\n", tmp_path, monkeypatch)
    assert shared.import_errors == {} and "reaper_gce_enforcement" in shared.dags


def test_config_check_logs_the_executors_and_the_store_it_accepted(dagbag, caplog, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    caplog.set_level(logging.INFO)
    config_check(dagbag, monkeypatch, tmp_path, "airflow: {sweep_store: 'file:///srv/sweeps'}\n")
    assert "executors LocalExecutor, sweep store file:///srv/sweeps: accepted" in caplog.text


def test_config_check_runs_the_preflight_after_the_config_and_fails_on_a_failed_check(
    dagbag, monkeypatch, tmp_path
) -> None:
    """The DAG is the preflight's other door (``reaper check``): a failed check fails its task."""
    from airflow.sdk.exceptions import AirflowFailException

    dag = dagbag.dags["reaper_config_check"]
    assert dag.get_task("preflight").upstream_task_ids == {"check_config"}
    config = tmp_path / "reaper.yaml"
    # No such connection: the ledger's check fails, and says so by its key.
    config.write_text("ledger: {conn_id: no_such_connection}\ngce: {enabled: false}\nk8s: {enabled: false}\n")
    monkeypatch.setenv("REAPER_CONFIG", str(config))
    with pytest.raises(AirflowFailException, match=r"1 preflight checks failed: FAIL ledger\.conn_id: "):
        dag.get_task("preflight").python_callable()
