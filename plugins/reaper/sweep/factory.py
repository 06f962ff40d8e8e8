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
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import zip_longest

import msgspec
from airflow.sdk import DAG, ObjectStoragePath, Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from reaper.config import Settings
from reaper.model import Action, Decision, Evidence, Override, Phase, Plan
from reaper.sweep.alerts import notifiers
from reaper.sweep.targets import TARGETS

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


def _fence(ctx: dict[str, str], target: str, resource: object, action: str) -> dict[str, object]:
    return {**ctx, "target": target, "scope": resource.scope, "uid": _uid(resource), "action": action}  # type: ignore[attr-defined]


def _run_context() -> tuple[dict[str, object], dict[str, str]]:
    context = get_current_context()
    run = context["dag_run"]
    return context, {"dag_id": run.dag_id, "run_id": run.run_id}


def _path(config: Settings, ids: dict[str, str], name: str) -> ObjectStoragePath:
    safe_run = ids["run_id"].replace(":", "_").replace("+", "_")
    return ObjectStoragePath(config.airflow.sweep_store) / ids["dag_id"] / safe_run / name


def delete_batch(ledger, target, ids: dict[str, str], resources: list[object]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Delete one batch, safely under task retries.

    Resources with an outcome already in the ledger for this sweep are skipped: a
    retry never deletes twice. The intents are written (acknowledged) before any
    delete is sent; if that write fails, this raises and nothing is deleted. A
    crash after a delete and before its outcome is harmless: the retry's
    re-validation finds the resource gone (``already_gone``) and records that.
    """
    done = ledger.outcomes(ids["dag_id"], ids["run_id"], {_uid(r) for r in resources})
    todo = [r for r in resources if (r.scope, _uid(r)) not in done]  # type: ignore[attr-defined]
    ledger.write([{**_fence(ids, target.name, r, "delete_intent"), "kind": "intent", "name": r.name} for r in todo])
    outcomes = target.delete(todo)
    ledger.write([{**ids, "target": target.name, "action": "outcome", "kind": "outcome", **o} for o in outcomes])
    return dict(Counter(o["result"] for o in outcomes))


def interleaved(decisions: list[Decision]) -> list[Decision]:
    """Round-robin over scopes: the first of each scope, then the second of each, and so on.

    The policy yields deletes scope by scope; cut into batches as they come, one batch would
    hold a few scopes and wait on their per-scope rate limits while the others sit idle. Taken
    in turns, every batch spreads over as many scopes as there are, and the per-scope limits
    stop bounding the sweep.
    """
    by_scope: dict[str, list[Decision]] = {}
    for d in decisions:
        by_scope.setdefault(d.resource.scope, []).append(d)
    rounds = zip_longest(*by_scope.values())
    return [d for turn in rounds for d in turn if d is not None]


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
    timeout = interval * 0.9 if interval else timedelta(hours=1)
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
            wanted = list(p.get("scopes") or configured)
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
            if ledger.acquire(name, f"{ids['dag_id']}/{ids['run_id']}", timeout) is None:
                raise AirflowFailException(f"another reaper {name} sweep holds the {name} sweep lease; not sweeping")
            shards = min(config.airflow.shards, max(1, len(wanted)))
            return [s for s in (sorted(wanted)[i::shards] for i in range(shards)) if s]

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
            }

        def _resources(listings: list[dict[str, object]]) -> list[object]:
            decoder = msgspec.json.Decoder(list[target.resource_type])
            return [r for x in listings for r in decoder.decode(ObjectStoragePath(str(x["path"])).read_bytes())]

        @task
        def gather_evidence(listings: list[dict[str, object]]) -> dict[str, object]:
            _, ids = _run_context()
            listings = list(listings)  # the mapped results, fetched once (each pass would fetch them again)
            incomplete = [scope for x in listings for scope in x["incomplete"]]  # type: ignore[attr-defined]
            evidence = target.evidence(_resources(listings), incomplete)  # type: ignore[arg-type]
            # Everything the policy sees was read by now: labels since listing began, the stores just now.
            evidence = msgspec.structs.replace(
                evidence,
                swept=frozenset((target.name, scope) for x in listings for scope in x["scopes"]),  # type: ignore[attr-defined]
                observed_until=datetime.now(UTC).timestamp(),
            )
            path = _path(config, ids, "evidence.json")
            path.write_bytes(msgspec.json.encode(evidence))
            return {"path": str(path), "incomplete": incomplete}

        @task
        def evaluate_policy(
            listings: list[dict[str, object]], evidence_ref: dict[str, object]
        ) -> list[list[dict[str, object]]]:
            """Returns the candidate batches (``delete`` maps over them); the summary goes to XCom ``summary``."""
            context, ids = _run_context()
            listings = list(listings)
            p = context["params"]
            evidence = msgspec.json.decode(ObjectStoragePath(str(evidence_ref["path"])).read_bytes(), type=Evidence)
            user = str(getattr(context["dag_run"], "triggering_user_name", None) or "scheduler")
            override = Override(str(p["override_reason"]), user) if p.get("override_budget") else None
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
            _ledger(config).write(records)
            deletes = [] if p.get("dry_run") or plan.capped else interleaved(plan.deletes())
            size = config.airflow.delete_batch_size
            batches = [
                [msgspec.to_builtins(d.resource) for d in deletes[i : i + size]] for i in range(0, len(deletes), size)
            ]
            summary = _summary(plan)
            summary["override"] = {"reason": override.reason, "user": override.user} if override else None
            summary["dry_run"] = bool(p.get("dry_run"))
            summary["hygiene"] = dict(sum((Counter(x.get("hygiene") or {}) for x in listings), Counter()))
            summary["incomplete"] = {s: probs for x in listings for s, probs in (x["incomplete"] or {}).items()}
            summary["deletes"] = len(plan.deletes())
            context["ti"].xcom_push(key="summary", value=summary)
            return batches

        def _summary_of_sweep() -> dict[str, object]:
            return get_current_context()["ti"].xcom_pull(task_ids="evaluate_policy", key="summary")

        @task.branch
        def budget_check() -> str:
            summary = _summary_of_sweep()
            deletes = int(summary["deletes"])  # type: ignore[call-overload]
            if summary["capped"]:
                why = f"max_deletions_per_sweep exceeded ({summary['capped']}): everything is reported"
            elif summary["dry_run"]:
                why = "dry_run: nothing is deleted"
            elif deletes == 0:
                why = "nothing to delete"
            else:
                why = f"{deletes} deletes within the cap"
            branch = "report_only" if summary["capped"] or summary["dry_run"] or deletes == 0 else "delete"
            log.info("budget_check -> %s: %s", branch, why)
            get_current_context()["ti"].xcom_push(key="branch", value={"branch": branch, "why": why})
            return branch

        @task(pool=f"reaper_{name}", pool_slots=1)
        def delete(batch: list[dict[str, object]]) -> dict[str, int]:
            _, ids = _run_context()
            resources = [msgspec.convert(b, type=target.resource_type) for b in batch]
            return delete_batch(_ledger(config), target, ids, resources)

        @task
        def report_only() -> int:
            summary = _summary_of_sweep()
            reported = sum(int(d["count"]) for d in summary["decisions"] if d["action"] != "keep")  # type: ignore[index,union-attr]
            log.info("report only: %d decisions recorded in the ledger, nothing deleted", reported)
            return reported

        @task(trigger_rule="none_failed_min_one_success")
        def record() -> dict[str, object]:
            context, ids = _run_context()
            summary = _summary_of_sweep()
            ledger = _ledger(config)
            branch = context["ti"].xcom_pull(task_ids="budget_check", key="branch") or {}
            outcomes = Counter(str(o["result"]) for o in ledger.outcomes(ids["dag_id"], ids["run_id"]).values())
            doc = {**ids, "target": name, "phase": phase.value, **branch, "outcomes": dict(outcomes), **summary}
            if config.metrics.pushgateway_url:
                from reaper.metrics import push_sweep

                doc["metrics_push_failures"] = push_sweep(
                    config.metrics.pushgateway_url,
                    ids["dag_id"],
                    name,
                    summary,
                    dict(outcomes),
                    datetime.now(UTC).timestamp(),
                    config.metrics.timeout.total_seconds(),
                )
            ledger.summary(doc)
            return {"branch": branch.get("branch"), "outcomes": dict(outcomes)}

        @task
        def release_lease() -> None:
            """The teardown of ``resolve_scopes``: runs whenever the lease was taken, even after a
            failed task, so the next sweep need not wait for the lease to expire."""
            _, ids = _run_context()
            _ledger(config).release(name, f"{ids['dag_id']}/{ids['run_id']}")

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
