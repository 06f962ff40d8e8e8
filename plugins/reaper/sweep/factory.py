"""The DAG factory: one DAG per target and rollout phase, all with the same task graph (docs/design.md §8).

``resolve_scopes`` -> ``list_inventory`` (mapped over at most ``airflow.shards``
shards of scopes) -> ``gather_evidence`` -> ``evaluate_policy`` (the same
``reaper.policy.evaluate`` as the CLI) -> ``budget_check`` (branch) -> ``delete``
(mapped over candidate batches, in the target's pool) or ``report_only`` ->
``record`` -> ``release_lease`` (the teardown of ``resolve_scopes``, which takes the
target's sweep lease: it runs even when a task failed). Each task is a few lines
around its step in :mod:`reaper.sweep.steps`, which also types what travels between
them. Inventories and evidence travel through files in ``airflow.sweep_store`` (any
ObjectStoragePath URL); XCom carries summaries and small candidate batches only,
never inventories or Secret data.

Parsing a DAG file reads the config file and nothing else: no connections, no network.
"""

from __future__ import annotations

import getpass
import logging
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec
from airflow.sdk import DAG, Context, Param, dag, get_current_context, task

from reaper.config import ConfigError, Settings, config_path
from reaper.model import Phase, QuotaUse, Resolved, dag_id_of
from reaper.sweep import steps
from reaper.sweep.alerts import notifiers
from reaper.sweep.gate import gated
from reaper.sweep.targets import TARGETS, Target

log = logging.getLogger(__name__)
T = TypeVar("T")
LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})  # tasks on this machine
PHASES = {
    "gce": [Phase.TELEMETRY, Phase.TERMINATED_CLEANUP, Phase.REPORT_ONLY, Phase.ENFORCEMENT],
    "k8s": [Phase.TELEMETRY, Phase.REPORT_ONLY, Phase.ENFORCEMENT],
}


def build_dags(config: Settings, target: str) -> dict[str, DAG]:
    """Every DAG of ``target``; none when the target is disabled in the config. A sweep store the
    configured executors cannot share is an import error naming the key (:func:`refuse_unshared_store`)."""
    if not getattr(config, target).enabled:
        return {}
    refuse_unshared_store(config, executors())
    return {dag_id_of(target, phase): _build(config, target, phase) for phase in PHASES[target]}


def executors() -> list[str]:
    """The class names of the executors Airflow is configured with (``core.executor``, a list in Airflow 3)."""
    from airflow.configuration import conf

    names = [entry.split(":")[-1].strip() for entry in str(conf.get("core", "executor")).split(",")]
    return [name.rsplit(".", 1)[-1] for name in names if name]


def refuse_unshared_store(config: Settings, names: list[str]) -> None:
    """Tasks hand their inventories and evidence over through ``airflow.sweep_store``: a store on this
    machine's disk only works when every task runs on this machine (docs/design.md §8)."""
    store = config.airflow.sweep_store
    remote = [name for name in names if name not in LOCAL_EXECUTORS]
    if remote and urlsplit(store).scheme in ("", "file"):
        raise ConfigError(
            f"invalid config {config_path()}: airflow.sweep_store: {store} is on one machine's disk, and "
            f"{', '.join(remote)} runs tasks on separate workers, which would not find each other's files; "
            "expected an object store every worker reaches (gs://bucket/path, s3://bucket/path)"
        )


def _build(config: Settings, name: str, phase: Phase) -> DAG:
    target = TARGETS[name](config)  # no I/O: its clients are made on first use, in a task
    timeout = config.run_timeout(name)
    # Optional Params are typed with "null": Airflow's Trigger form requires every Param whose type
    # lacks it, and keeps the button disabled while such a field is empty (a cleared list field sends null).
    params: dict[str, Param] = {
        "dry_run": Param(False, type="boolean", description="Run the whole graph, delete nothing."),
        "scopes": Param(
            [],
            type=["null", "array"],
            items={"type": "string"},
            description="Only these projects or clusters (default: all configured).",
        ),
    }
    if phase is not Phase.TELEMETRY:
        params["override_budget"] = Param(
            False,
            type="boolean",
            description="Lift the budget holds of the scopes override_scopes names (needs override_reason).",
        )
        params["override_scopes"] = Param(
            [],
            type=["null", "array"],
            items={"type": "string"},
            description=(
                f"With override_budget: the {target.scope_key} whose budget hold it lifts, one a line, as the "
                "audit view lists them held; a budget hold in any other scope stands."
            ),
        )
        params["override_reason"] = Param(
            None,
            type=["null", "string"],
            description="Why (needed by override_budget and a raised max_deletions); recorded in the ledger.",
        )
        params["max_deletions"] = Param(
            None,
            type=["null", "integer"],
            minimum=0,
            description=(
                f"This run's global cap (default: max_deletions_per_sweep, {config.max_deletions_per_sweep}), "
                "over all its scopes: override_scopes does not narrow it. Above the default only with "
                "override_reason, for incident recovery; recorded with the user."
            ),
        )
        params["approval"] = Param(
            None,
            type=["null", "string"],
            description=(
                "An approval's id (the sweep page's Approve button or `reaper approve`): delete only the held items "
                "it approved, each still in the state it was reviewed in; anything new, changed or past its expiry "
                "stays held. Used by one run only; not with override_budget or max_deletions."
            ),
        )
    if gated(phase, target.active_phase):
        params["confirm_phase"] = Param(
            None,
            type=["null", "string"],
            description=(
                f"Empty: this run is a dry run, since {phase.value} is not {name}'s active phase "
                f"({target.active_phase.value}, rollout.{name}). To let it delete as {phase.value} does, type "
                f"{phase.value} here and give override_reason; recorded with the user, its metrics pushed."
            ),
        )
    dag_id = dag_id_of(name, phase)
    alerts = notifiers(config.airflow.alerts)

    @dag(
        dag_id=dag_id,
        # Only the active phase runs on the schedule; the others are for manual triggers.
        schedule=target.schedule if target.schedule and target.active_phase is phase else None,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=timeout,
        tags=["reaper", name, phase.value],
        params=params,
        default_args={
            "retries": config.airflow.retries,
            "retry_delay": config.airflow.retry_delay,
            "retry_exponential_backoff": True,
            "max_retry_delay": timeout / 4,
            "on_failure_callback": alerts,
        },
        on_failure_callback=alerts,  # type: ignore[arg-type]  # notifiers: Airflow takes them, its types say callables
        doc_md=f"Reaper sweep of **{name}** in phase **{phase.value}**. {__doc__.split(chr(10))[0]}",
    )
    def sweep() -> None:
        @task
        def resolve_scopes() -> list[list[dict[str, Any]]]:
            sweep, context = _current(config, target, phase)
            setup = steps.resolve_scopes(sweep, context["params"])
            context["ti"].xcom_push(key="lease", value=_xcom(setup.lease))
            context["ti"].xcom_push(key="quota", value=msgspec.to_builtins(setup.quota))
            shards: list[list[dict[str, Any]]] = msgspec.to_builtins(setup.shards)
            return shards

        @task
        def list_inventory(shard: list[dict[str, Any]], lease: dict[str, Any]) -> dict[str, Any]:
            sweep, context = _current(config, target, phase)
            scopes = _typed(shard, list[Resolved])
            index = context["ti"].map_index  # always set: the task is mapped (-1 is Airflow's "not mapped")
            shard_index = -1 if index is None else index
            return _xcom(steps.list_inventory(sweep, scopes, shard_index, _typed(lease, steps.Lease)))

        @task
        def gather_evidence(shards: list[dict[str, Any]], lease: dict[str, Any]) -> dict[str, Any]:
            sweep, context = _current(config, target, phase)
            # The mapped results, fetched once (each pass over them would fetch them again).
            typed = [_typed(s, steps.Shard) for s in shards]
            resolving = _typed(
                context["ti"].xcom_pull(task_ids="resolve_scopes", key="quota") or {}, dict[str, QuotaUse]
            )
            return _xcom(steps.gather_evidence(sweep, typed, _typed(lease, steps.Lease), resolving))

        @task
        def evaluate_policy(sweep_input: dict[str, Any], lease: dict[str, Any]) -> list[dict[str, Any]]:
            sweep, context = _current(config, target, phase)
            run = context["dag_run"]
            user = str(getattr(run, "triggering_user_name", None) or "scheduler")
            if user == "dag_test":  # `airflow dags test` names no Airflow user: who ran it is who runs this process
                user = f"dag_test ({getpass.getuser()})"
            input_ = _typed(sweep_input, steps.SweepInput)
            planned = steps.evaluate_policy(
                sweep, input_, context["params"], user, _typed(lease, steps.Lease), run.start_date
            )
            context["ti"].xcom_push(key="summary", value=_xcom(planned.summary))
            return [_xcom(batch) for batch in planned.batches]

        @task.branch
        def budget_check(summary: dict[str, Any]) -> str:
            """Delete, or only report: the global cap, a dry run, stale inputs or nothing to delete
            (:func:`reaper.sweep.steps.budget_check`; per-scope holds are already in the plan)."""
            chosen = steps.budget_check(_typed(summary, steps.Summary))
            log.info("budget_check -> %s: %s", chosen.branch, chosen.why)
            get_current_context()["ti"].xcom_push(key="branch", value=_xcom(chosen))  # a branch's return is not kept
            return chosen.branch

        @task(pool=f"reaper_{name}", pool_slots=1)
        def delete(batch: dict[str, Any], lease: dict[str, Any]) -> dict[str, Any]:
            sweep, context = _current(config, target, phase)
            typed = _typed(batch, steps.Batch[target.resource_type])  # type: ignore[name-defined]  # a run-time type
            return _xcom(steps.delete(sweep, typed, _typed(lease, steps.Lease), context["dag_run"].start_date))

        @task
        def report_only(summary: dict[str, Any]) -> int:
            return steps.report_only(_typed(summary, steps.Summary))

        @task(trigger_rule="all_done")
        def record() -> dict[str, object]:
            """Every execution's summary, also of one that failed (then the run fails here, after writing it).

            What the tasks before it left is pulled, not passed: an argument would fail this task when
            the task making it failed, ``budget_check`` skips whatever follows it directly, and a setup
            task (``resolve_scopes``) may only be followed directly by tasks that need its success.
            """
            sweep, context = _current(config, target, phase)
            ti = context["ti"]
            summary = ti.xcom_pull(task_ids="evaluate_policy", key="summary")
            lease = ti.xcom_pull(task_ids="resolve_scopes", key="lease")
            branch = ti.xcom_pull(task_ids="budget_check", key="branch")
            return steps.record(
                sweep,
                _typed(summary, steps.Summary) if summary else None,
                _typed(branch, steps.Branch) if branch else None,
                len(ti.xcom_pull(task_ids="evaluate_policy") or []),
                _ended(ti.xcom_pull(task_ids="delete", default=None)),
                _typed(lease, steps.Lease) if lease else None,
                context["dag_run"].start_date,
            )

        @task
        def release_lease() -> None:
            """The teardown of ``resolve_scopes``: runs whenever the lease was taken, even after a
            failed task, so the next sweep need not wait for the lease to expire."""
            steps.release_lease(_current(config, target, phase)[0])

        # Tasks called with XComArgs, which Airflow's types do not model (they say the function's own parameter
        # types): hence the ignores below.
        # A task can only be mapped over a return value: the shards and the batches are those,
        # the lease and the summary named outputs beside them.
        shards = resolve_scopes()
        lease = shards["lease"]  # type: ignore[index]  # an XComArg, see above
        listings = list_inventory.partial(lease=lease).expand(shard=shards)
        batches = evaluate_policy(gather_evidence(listings, lease), lease)  # type: ignore[arg-type]  # an XComArg, see above
        branch = budget_check(batches["summary"])  # type: ignore[index]  # an XComArg, see above
        deleted = delete.partial(lease=lease).expand(batch=batches)
        reported = report_only(batches["summary"])  # type: ignore[index]  # an XComArg, see above
        branch >> [deleted, reported]
        [deleted, reported] >> record() >> release_lease().as_teardown(setups=shards)  # type: ignore[arg-type]  # an XComArg, see above

    return sweep()


def _current(config: Settings, target: Target[Any], phase: Phase) -> tuple[steps.Execution, Context]:
    """The running task's context, and the execution of the sweep it belongs to (:class:`steps.Ids`)."""
    context = get_current_context()
    run = context["dag_run"]
    ids = steps.Ids(run.dag_id, run.run_id, int(run.clear_number or 0))
    return steps.Execution(config, target, phase, ids), context


def _xcom(payload: msgspec.Struct) -> dict[str, Any]:
    """A typed payload as the plain data XCom stores."""
    data: dict[str, Any] = msgspec.to_builtins(payload)
    return data


def _typed(value: object, kind: type[T]) -> T:
    """Plain data from XCom as its typed payload."""
    return msgspec.convert(value, kind)


def _ended(found: object) -> list[steps.Deleted]:
    """What this execution's mapped delete tasks returned: one per batch that ended (none on the report branch)."""
    if found is None:
        return []
    ended = [r for r in (found if isinstance(found, list | tuple) else [found]) if isinstance(r, dict)]
    return [_typed(r, steps.Deleted) for r in ended]
