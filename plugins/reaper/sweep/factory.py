"""The DAG factory: one DAG per target and rollout phase, all with the same task graph (DESIGN.md section 8).

``resolve_scopes`` -> ``list_inventory`` (mapped over at most ``airflow.shards``
shards of scopes) -> ``gather_evidence`` -> ``evaluate_policy`` (the same
``reaper.policy.evaluate`` as the CLI) -> ``budget_check`` (branch) -> ``delete``
(mapped over candidate batches, in the target's pool) or ``report_only`` ->
``record`` -> ``release_lease`` (the teardown of ``resolve_scopes``, which takes the
target's sweep lease: it runs even when a task failed). Inventories and evidence travel through files in
``airflow.sweep_store`` (any ObjectStoragePath URL); XCom carries summaries and
small candidate batches only, never inventories or Secret data.

Parsing a DAG file reads the config file and nothing else: no connections, no network.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import msgspec
from airflow.sdk import DAG, ObjectStoragePath, Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from reaper.config import Settings
from reaper.model import Action, Evidence, Override, Phase, Plan
from reaper.sweep.alerts import notifiers
from reaper.sweep.deletes import STALE_PLAN, Fence, PlanRef, config_digest, cut_batches, delete_batch, stale
from reaper.sweep.targets import TARGETS

if TYPE_CHECKING:
    from reaper.ledger import Ledger

log = logging.getLogger(__name__)
PHASES = {
    "gce": [Phase.TELEMETRY, Phase.TERMINATED_CLEANUP, Phase.REPORT_ONLY, Phase.ENFORCEMENT],
    "k8s": [Phase.TELEMETRY, Phase.REPORT_ONLY, Phase.ENFORCEMENT],
}


def dag_id_of(target: str, phase: Phase) -> str:
    return f"reaper_{target}_{phase.value.replace('-', '_')}"


def build_dags(config: Settings, target: str) -> dict[str, DAG]:
    """Every DAG of ``target``; none when the target is disabled in the config."""
    if not getattr(config, target).enabled:
        return {}
    return {dag_id_of(target, phase): _build(config, target, phase) for phase in PHASES[target]}


def _ledger(config: Settings):  # type: ignore[no-untyped-def]
    from reaper.ledger import Ledger
    from reaper.stores.mongo import mongo_client

    ledger_cfg = config.ledger
    return Ledger(mongo_client(ledger_cfg.conn_id, ledger_cfg.timeout.total_seconds()), ledger_cfg)


def _uid(resource: object) -> str:
    return str(getattr(resource, "uid", None) or resource.id)  # type: ignore[attr-defined]


def _fence(ctx: dict[str, object], target: str, resource: object, action: str) -> dict[str, object]:
    return {**ctx, "target": target, "scope": resource.scope, "uid": _uid(resource), "action": action}  # type: ignore[attr-defined]


def _run_context() -> tuple[dict[str, object], dict[str, object]]:
    """The task's context, and the ids of this execution of the sweep.

    Clearing any task of a DAG run raises its ``clear_number``: each value is one execution,
    with its own plan, its own ledger records and its own summary (DESIGN.md sections 6 and 7).
    """
    context = get_current_context()
    run = context["dag_run"]
    return context, {"dag_id": run.dag_id, "run_id": run.run_id, "execution": int(run.clear_number or 0)}


def _sweep_ids(ids: dict[str, object], lease: dict[str, object]) -> dict[str, object]:
    """The ledger's ids of one execution: the run's, and the token of the sweep lease it holds.

    ``clear_number`` alone does not tell executions apart (clearing tasks without resetting the run
    keeps it), but every execution takes the lease anew: its token is new (a retried task keeps it).
    """
    return {**ids, "lease": str(lease.get("token") or "")}


def _holder(ids: dict[str, object]) -> str:
    return f"{ids['dag_id']}/{ids['run_id']}#{ids['execution']}"


def _path(config: Settings, ids: dict[str, object], name: str) -> ObjectStoragePath:
    safe_run = str(ids["run_id"]).replace(":", "_").replace("+", "_")
    return ObjectStoragePath(config.airflow.sweep_store) / str(ids["dag_id"]) / safe_run / str(ids["execution"]) / name


def _summary(plan: Plan) -> dict[str, object]:
    counts: Counter[tuple[str, str, str, str, str]] = Counter(
        (d.target, d.scope, d.rule or "", d.reason, d.action.value) for d in plan.acted
    )
    kept: Counter[str] = Counter()
    for _, reason, group in plan.kept:
        kept[reason] += len(group)
    return {
        "phase": plan.phase.value,
        "decisions": [
            {"target": t, "scope": s, "rule": rule, "reason": reason, "action": action, "count": n}
            for (t, s, rule, reason, action), n in sorted(counts.items())
        ],
        "kept": dict(kept),
        "scopes": [v.as_dict() for v in plan.scopes],
        "capped": plan.capped,
        "census": plan.census,
    }


def _build(config: Settings, name: str, phase: Phase) -> DAG:
    interval: timedelta = getattr(config.airflow, f"{name}_schedule")
    timeout = config.run_timeout(name)
    params: dict[str, Param] = {
        "dry_run": Param(False, type="boolean", description="Run the whole graph, delete nothing."),
        "scopes": Param(
            [],
            type="array",
            items={"type": "string"},
            description="Only these projects or clusters (default: all configured).",
        ),
    }
    if phase is not Phase.TELEMETRY:
        params["override_budget"] = Param(
            False, type="boolean", description="Lift per-scope budget holds (needs override_reason)."
        )
        params["override_reason"] = Param("", type="string", description="Why; recorded in the ledger.")
    dag_id = dag_id_of(name, phase)
    alerts = notifiers(config.airflow.alerts)

    @dag(
        dag_id=dag_id,
        schedule=interval if interval else None,
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
        on_failure_callback=alerts,
        doc_md=f"Reaper sweep of **{name}** in phase **{phase.value}**. {__doc__.split(chr(10))[0]}",
    )
    def sweep() -> None:
        target = TARGETS[name](config)

        @task
        def resolve_scopes() -> list[list[str]]:
            context, ids = _run_context()
            p = context["params"]
            configured = target.scopes()
            wanted = list(dict.fromkeys(p.get("scopes") or configured))  # a scope named twice is swept once
            unknown = sorted(set(wanted) - set(configured))
            if unknown:
                raise AirflowFailException(
                    f"params.scopes: {unknown} are not configured; expected a subset of "
                    f"{configured} (config key {name}.{'projects' if name == 'gce' else 'clusters'})"
                )
            if p.get("override_budget") and not str(p.get("override_reason") or "").strip():
                raise AirflowFailException("params.override_reason: expected a non-empty reason with override_budget")
            ledger = _ledger(config)
            ledger.ensure_indexes()
            lease = _wait_for_lease(ledger, name, _holder(ids), timeout, config.airflow.lease_wait)
            if isinstance(lease, str):
                # DESIGN.md 8: the DAGs of one target never sweep at once; waiting out another is no failure.
                # Skipping the setup skips the whole sweep: its summary is written here.
                skipped = {"target": name, "phase": phase.value, "state": "skipped", "why": lease}
                ledger.summary({**_sweep_ids(ids, {}), **skipped})
                raise AirflowSkipException(lease)
            context["ti"].xcom_push(key="lease", value=lease)
            shards = min(config.airflow.shards, max(1, len(wanted)))
            return [s for s in (sorted(wanted)[i::shards] for i in range(shards)) if s]

        def _lease() -> dict[str, object]:
            return get_current_context()["ti"].xcom_pull(task_ids="resolve_scopes", key="lease") or {}

        @task
        def list_inventory(shard: list[str]) -> dict[str, object]:
            context, ids = _run_context()
            listed_at = datetime.now(UTC).timestamp()  # before any label is read
            listing = target.list(shard)
            path = _path(config, ids, f"inventory-{context['ti'].map_index}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(msgspec.json.encode(listing.resources))
            if listing.hygiene:
                log.warning("hygiene findings (reported, never acted on): %s", listing.hygiene)
            return {
                "path": str(path),
                "scopes": shard,
                "count": len(listing.resources),
                "incomplete": listing.problems,
                "hygiene": listing.hygiene,
                "listed_at": listed_at,
                "token": _lease().get("token"),
            }

        def _resources(listings: list[dict[str, object]]) -> list[object]:
            decoder = msgspec.json.Decoder(list[target.resource_type])
            return [r for x in listings for r in decoder.decode(ObjectStoragePath(str(x["path"])).read_bytes())]

        @task
        def gather_evidence(listings: list[dict[str, object]]) -> dict[str, object]:
            _, ids = _run_context()
            listings = list(listings)  # the mapped results, fetched once (each pass would fetch them again)
            incomplete = [scope for x in listings for scope in x["incomplete"]]  # type: ignore[attr-defined]
            resources = _resources(listings)
            evidence = target.evidence(resources, incomplete)  # type: ignore[arg-type]
            # Everything the policy sees was read by now: labels since listing began, the stores just now.
            evidence = msgspec.structs.replace(
                evidence,
                swept=frozenset((target.name, scope) for x in listings for scope in x["scopes"]),  # type: ignore[attr-defined]
                observed_until=datetime.now(UTC).timestamp(),
            )
            warnings = target.warnings(resources)  # type: ignore[arg-type]
            for warning in warnings:
                log.warning("%s", warning)
            path = _path(config, ids, "evidence.json")
            path.write_bytes(msgspec.json.encode(evidence))
            return {"path": str(path), "incomplete": incomplete, "token": _lease().get("token"), "warnings": warnings}

        @task
        def evaluate_policy(
            listings: list[dict[str, object]], evidence_ref: dict[str, object]
        ) -> list[dict[str, object]]:
            """Returns the candidate batches (``delete`` maps over them); the summary goes to XCom ``summary``."""
            context, ids = _run_context()
            listings = list(listings)
            p = context["params"]
            evidence = msgspec.json.decode(ObjectStoragePath(str(evidence_ref["path"])).read_bytes(), type=Evidence)
            run = context["dag_run"]
            triggered_by = str(getattr(run, "triggering_user_name", None) or "scheduler")
            lease = _lease()
            ledger = _ledger(config)
            ids = _sweep_ids(ids, lease)
            override, override_record = _override(p, ids, triggered_by, ledger.earlier_execution(ids))
            from reaper.policy import evaluate

            # Ages are measured at the time the inventory was read, not later: a label read then may
            # have been refreshed since, so the later the clock, the less conservative every age.
            as_of = datetime.fromtimestamp(min(float(x["listed_at"]) for x in listings), UTC)  # type: ignore[arg-type]
            plan = evaluate(_resources(listings), evidence, config, phase, as_of, override)  # type: ignore[arg-type]
            records = [
                {
                    **_fence(ids, d.target, d.resource, d.action.value),
                    "kind": "decision",
                    "rule": d.rule,
                    "reason": d.reason,
                    "name": d.resource.name,
                    "location": d.resource.location,
                    "evidence": d.evidence,
                }
                for d in plan.acted
                if d.action is not Action.KEEP
            ]
            ledger.write(records)
            token = str(ids["lease"])
            # Inputs listed or read under another lease (a partly cleared run) are another execution's.
            foreign = token == "" or any(x.get("token") != token for x in [*listings, evidence_ref])
            plan_ref = PlanRef(int(ids["execution"]), token, config_digest(config))  # type: ignore[call-overload]
            deletes = [] if p.get("dry_run") or plan.capped or foreign else plan.deletes()
            units = cut_batches([d.resource for d in deletes], config.airflow.delete_batch_size, target.unit)
            batches = [{"plan": msgspec.to_builtins(plan_ref), "resources": msgspec.to_builtins(u)} for u in units]
            summary = _summary(plan)
            summary.update(
                override=override_record,
                triggered_by=triggered_by,
                dry_run=bool(p.get("dry_run")),
                stale_inputs=foreign,
                warnings=evidence_ref.get("warnings") or [],
                hygiene=dict(sum((Counter(x.get("hygiene") or {}) for x in listings), Counter())),
                incomplete={s: probs for x in listings for s, probs in (x["incomplete"] or {}).items()},
                deletes=len(plan.deletes()),
            )
            context["ti"].xcom_push(key="summary", value=summary)
            return batches

        def _summary_of_sweep() -> dict[str, object]:
            return get_current_context()["ti"].xcom_pull(task_ids="evaluate_policy", key="summary")

        @task.branch
        def budget_check() -> str:
            """Choose between deleting and only reporting, for the reasons that stop the whole sweep.

            Per-scope holds (budget, writer health, incomplete listings) are already in the plan as
            reports; here: the global cap, a dry run, inputs from another execution, or nothing to do.
            """
            summary = _summary_of_sweep()
            deletes = int(summary["deletes"])  # type: ignore[call-overload]
            if summary["capped"]:
                why = f"max_deletions_per_sweep exceeded ({summary['capped']}): everything is reported"
            elif summary["dry_run"]:
                why = "dry_run: nothing is deleted"
            elif summary.get("stale_inputs") and deletes:
                why = "the listing or evidence was read by another execution or under another lease: reported only"
            elif deletes == 0:
                why = "nothing to delete"
            else:
                why = f"{deletes} deletes within the cap"
            reports = summary["capped"] or summary["dry_run"] or summary.get("stale_inputs") or deletes == 0
            branch = "report_only" if reports else "delete"
            log.info("budget_check -> %s: %s", branch, why)
            get_current_context()["ti"].xcom_push(key="branch", value={"branch": branch, "why": why})
            return branch

        @task(pool=f"reaper_{name}", pool_slots=1)
        def delete(batch: dict[str, object]) -> dict[str, int]:
            context, ids = _run_context()
            lease = _lease()
            current = PlanRef(int(ids["execution"]), str(lease.get("token") or ""), config_digest(config))  # type: ignore[call-overload]
            why = stale(msgspec.convert(batch["plan"], PlanRef), current)
            resources = [msgspec.convert(b, type=target.resource_type) for b in batch["resources"]]  # type: ignore[union-attr]
            if why:
                # Another execution's plan: never run it. The next sweep plans again from what it lists.
                log.warning("not deleting %d planned resources: %s", len(resources), why)
                return {STALE_PLAN: len(resources)}
            started = context["dag_run"].start_date
            ends = [float(lease["expires_at"])]  # type: ignore[arg-type]
            if started is not None:
                ends.append((started + timeout).timestamp())
            deadline = min(ends) - config.send_margin(name).total_seconds()
            fence = Fence(_sweep_ids(ids, lease), _holder(ids), str(lease["token"]), deadline)
            return delete_batch(_ledger(config), target, fence, resources)

        @task
        def report_only() -> int:
            summary = _summary_of_sweep()
            reported = sum(int(d["count"]) for d in summary["decisions"] if d["action"] != "keep")  # type: ignore[index,union-attr]
            log.info("report only: %d decisions recorded in the ledger, nothing deleted", reported)
            return reported

        @task(trigger_rule="all_done")
        def record() -> dict[str, object]:
            """Every execution's summary, also of one that failed (then the run fails here, after writing it)."""
            context, ids = _run_context()
            ids = _sweep_ids(ids, _lease())
            ti = context["ti"]
            summary = _summary_of_sweep() or {}
            ledger = _ledger(config)
            branch = ti.xcom_pull(task_ids="budget_check", key="branch") or {}
            results = _delete_results(context)
            planned = len(ti.xcom_pull(task_ids="evaluate_policy") or []) if branch.get("branch") == "delete" else 0
            completed = bool(summary) and bool(branch) and len(results) >= planned
            outcomes = Counter(str(o["result"]) for o in ledger.outcomes(ids).values())
            stale_plans = sum(int(r.get(STALE_PLAN, 0)) for r in results)
            doc = {**ids, "target": name, "phase": phase.value, **branch, "outcomes": dict(outcomes), **summary}
            doc.update(stale_plan=stale_plans, state="success" if completed else "failed")
            if completed and config.metrics.pushgateway_url:
                from reaper.metrics import push_sweep

                doc["metrics_push_failures"] = push_sweep(
                    config.metrics.pushgateway_url,
                    str(ids["dag_id"]),
                    name,
                    summary,
                    dict(outcomes),
                    datetime.now(UTC).timestamp(),
                    config.metrics.timeout.total_seconds(),
                )
            ledger.summary(doc)
            if not completed:
                raise AirflowFailException(
                    f"the sweep did not complete ({len(results)} of {planned} delete batches ended); "
                    "its summary and outcomes so far are in the ledger"
                )
            return {"branch": branch.get("branch"), "outcomes": dict(outcomes), "stale_plan": stale_plans}

        @task
        def release_lease() -> None:
            """The teardown of ``resolve_scopes``: runs whenever the lease was taken, even after a
            failed task, so the next sweep need not wait for the lease to expire."""
            _, ids = _run_context()
            _ledger(config).release(name, _holder(ids))

        shards = resolve_scopes()
        listings = list_inventory.expand(shard=shards)
        evidence_ref = gather_evidence(listings)
        batches = evaluate_policy(listings, evidence_ref)
        branch = budget_check()
        deleted = delete.expand(batch=batches)
        reported = report_only()
        batches >> branch >> [deleted, reported]
        [deleted, reported] >> record() >> release_lease().as_teardown(setups=shards)

    return sweep()


def _wait_for_lease(
    ledger: Ledger, target: str, holder: str, ttl: timedelta, wait: timedelta
) -> dict[str, object] | str:
    """The target's sweep lease, waiting up to ``wait`` for another sweep to end; else why not."""
    give_up = time.monotonic() + wait.total_seconds()
    while True:
        lease = ledger.acquire(target, holder, ttl)
        if lease is not None:
            return lease
        if time.monotonic() >= give_up:
            return f"another {target} sweep ({ledger.holder(target) or '?'}) holds the sweep lease; skipped"
        time.sleep(min(5.0, max(0.0, give_up - time.monotonic())))


def _override(
    params: dict[str, object], ids: dict[str, object], triggered_by: str, rerun: bool
) -> tuple[Override | None, dict[str, object] | None]:
    """The budget override of this execution, and what the ledger records about it.

    An override is given for the evidence its trigger saw: it applies to the first execution of
    the run only. A cleared or re-run run (``rerun``: the ledger holds an earlier execution of it)
    sees new evidence and runs without it, and records that it did; Airflow does not tell a task who
    cleared its run (its audit log does).
    """
    if not params.get("override_budget"):
        return None, None
    record: dict[str, object] = {"reason": str(params["override_reason"]), "user": triggered_by}
    if rerun or int(ids["execution"]) > 0:  # type: ignore[call-overload]
        record.update(
            applied=False,
            why="the run was cleared or re-run: an override applies to its first execution only",
        )
        return None, record
    record["applied"] = True
    return Override(str(params["override_reason"]), triggered_by), record


def _delete_results(context: dict[str, object]) -> list[dict[str, int]]:
    """What this execution's mapped delete tasks returned: one per batch that ended (none on the report branch)."""
    found = context["ti"].xcom_pull(task_ids="delete", default=None)  # type: ignore[attr-defined]
    if found is None:
        return []
    return [r for r in (found if isinstance(found, list | tuple) else [found]) if isinstance(r, dict)]
