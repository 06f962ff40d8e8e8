"""The reaper's command line: what-if runs of the policy, config review, the preflight, alert rules, metric clean-up.

``reaper evaluate`` calls the same :func:`reaper.policy.evaluate` as the DAGs, so what it prints
is exactly what that phase would report and delete given the same evidence; it never deletes
anything. ``reaper diff`` evaluates two configs on one input and prints every resource whose
decision changes (docs/config-review.md). Exit 0 on success, 2 on invalid config or input (one
message on stderr, nothing on stdout); ``reaper check`` exits 1 when a check fails; ``reaper diff``
exits 3 when the new config would delete a resource the old one kept while its liveness evidence
is fresh or unknown. Output cut short by its reader (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn, TextIO

import msgspec

from reaper import __version__, decoders
from reaper.config import ConfigError, Settings, config_path, load_config
from reaper.model import Action, Decision, Evidence, K8sObject, Phase, Plan, Resource, place
from reaper.policy import evaluate
from reaper.report.reasons import Limits

if TYPE_CHECKING:
    from reaper.approvals import Approval
    from reaper.diff import Change, ConfigDiff
    from reaper.ledger import Ledger
    from reaper.report.reasons import Limits


def _timestamp(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an RFC 3339 timestamp such as 2026-11-29T12:00:00Z, got {text!r}"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"expected a timestamp with an offset (Z or +hh:mm), got {text!r}")
    try:
        datetime.fromtimestamp(when.timestamp(), UTC)  # what the output prints (_iso) must exist
    except (OverflowError, ValueError, OSError):
        raise argparse.ArgumentTypeError(
            f"expected a time between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z, got {text!r}"
        ) from None
    return when


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (exit status 2) like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="reaper", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"reaper {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    ev = commands.add_parser(
        "evaluate", help="what-if: evaluate a phase's policy on fleet exports or a recorded sweep input"
    )
    ev.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    ev.add_argument("--phase", choices=[p.value for p in Phase], default=Phase.REPORT_ONLY.value, help="rollout phase")
    _input_options(ev, "html: one self-contained page (charts, every finding with its reason in words) to share")
    df = commands.add_parser(
        "diff",
        help="config review: every resource whose decision changes from one config to another on the same input; "
        "exit 3 if the new one would delete what the old kept while its liveness evidence is fresh or unknown",
        description="Evaluate two configs on the same input and print every resource whose decision changes. "
        "Exit 0: no dangerous change; 2: invalid config or input; 3: the new config deletes a resource the old "
        "one kept (or did not select) while its liveness evidence (heartbeat, lease, run store, writer health) "
        "is fresh or unknown. See docs/config-review.md.",
    )
    df.add_argument("old", metavar="OLD", help="the config in force (e.g. the pull request's base)")
    df.add_argument("new", metavar="NEW", help="the config proposed")
    df.add_argument(
        "--phase",
        choices=["active", *(p.value for p in Phase)],
        default="active",
        help="active (default): each config evaluated in its own rollout.gce and rollout.k8s phases, what its "
        "scheduled sweeps would do, so a rollout step is a change too; a phase: both configs in that phase "
        "(a manual run of that phase's DAG)",
    )
    _input_options(df, "html: one self-contained page of the changes, reasons in words, to share")
    check = commands.add_parser(
        "check",
        help="preflight: the live systems the config points at (connections, stores, metrics, projects); "
        "exit 1 if any check fails",
    )
    check.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    rules = commands.add_parser("alert-rules", help="the Prometheus alert rules for a config, as YAML")
    rules.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    retire = commands.add_parser(
        "metrics-retire", help="delete a target's metric groups from the Pushgateway (a disabled target or scope)"
    )
    retire.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    retire.add_argument("--target", choices=["gce", "k8s"], required=True)
    retire.add_argument("--scope", action="append", metavar="SCOPE", help="only these scopes (default: all)")
    ok = commands.add_parser(
        "approve",
        help="approve a held sweep's candidates (all, or those named) for a run with param approval=<id>; "
        "prints the id",
        description="Record an approval of the deletes a sweep held (its budget or its cap), each in the state the "
        "sweep listed it in; a run of the same DAG triggered with approval=<id> deletes those still in that state "
        "and nothing else, once. See docs/cli.md and docs/runbook.md.",
    )
    ok.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    ok.add_argument("--dag", required=True, metavar="DAG_ID", help="the DAG of the held sweep (reaper_gce_enforcement)")
    ok.add_argument("--run", required=True, metavar="RUN_ID", help="the DAG run of the held sweep")
    which = ok.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every held candidate of the sweep")
    which.add_argument(
        "--item",
        action="append",
        metavar="NAME",
        help="a candidate by name, uid or (Kubernetes) run id; a run's objects are approved together",
    )
    ok.add_argument("--reason", required=True, help="why (an incident, a ticket); recorded")
    ok.add_argument("--expires", default="4h", help="how long the approval may be used: 1m to 7d (default: 4h)")
    ok.add_argument("--user", help="who approves (default: the login name, as cli:<name>)")
    revoke = commands.add_parser(
        "revoke",
        help="revoke an approval: no run uses it after, and a run using it sends no more deletes",
        description="Record that an approval is revoked, used or not: a run triggered with it fails before it "
        "deletes anything, and a run already using it sends nothing more within half a second (the sends under "
        "way finish). See docs/cli.md.",
    )
    revoke.add_argument("approval", metavar="APPROVAL_ID", help="the id reaper approve (or the sweep page) printed")
    revoke.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    revoke.add_argument("--reason", required=True, help="why (the review was wrong, the incident is over); recorded")
    revoke.add_argument("--user", help="who revokes (default: the login name, as cli:<name>)")
    reference = commands.add_parser(
        "config-reference", help="every config key with its type, default and description, as a Markdown table"
    )
    reference.add_argument(
        "--write", metavar="FILE", help="replace the table between the markers in FILE (docs/reference.md) instead"
    )
    return parser


def _input_options(parser: argparse.ArgumentParser, html: str) -> None:
    """The input both ``evaluate`` and ``diff`` read: fleet exports and evidence files, or a recorded sweep input."""
    parser.add_argument(
        "--now",
        type=_timestamp,
        help="evaluation time, RFC 3339 (default: the current time; with --recorded, when the sweep began listing)",
    )
    parser.add_argument("--gce", action="append", default=[], metavar="FILE", help="gcloud instances JSON export")
    parser.add_argument("--k8s", action="append", default=[], metavar="FILE", help="kubectl List JSON export")
    parser.add_argument("--cluster", default="default", help="scope name of the --k8s objects (default: default)")
    parser.add_argument("--runs", metavar="FILE", help="run-store documents; omitted: the store is unknown")
    parser.add_argument("--leases", metavar="FILE", help="run keys whose lease is held; omitted: leases unknown")
    parser.add_argument("--writer-health", metavar="FILE", help="heartbeat-writer reports; omitted: unknown")
    parser.add_argument(
        "--recorded",
        metavar="FILE",
        help="a sweep's recorded input instead of exports: sweep-input.msgpack, copied from its folder "
        "<airflow.sweep_store>/<dag_id>/<run_id>/<execution>/ (one target's resources and evidence)",
    )
    parser.add_argument("--format", choices=["json", "table", "html"], default="table", help=html)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    try:
        return _run(args, out)
    except BrokenPipeError:
        # The reader stopped reading (``| head``): not an error. Python's advice: point stdout at devnull so
        # that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(args: argparse.Namespace, out: TextIO) -> int:
    try:
        if args.command == "alert-rules":
            return _alert_rules(args, out)
        if args.command == "metrics-retire":
            return _metrics_retire(args, out)
        if args.command == "check":
            return _check(args, out)
        if args.command == "diff":
            return _diff(args, out)
        if args.command == "config-reference":
            return _config_reference(args, out)
        if args.command == "approve":
            return _approve(args, out)
        if args.command == "revoke":
            return _revoke(args, out)
        config = load_config(config_path(args.config))
        data = _inputs(args, [config])
        plan = evaluate(data.resources, data.evidence, config, Phase(args.phase), data.now)
    except ConfigError as exc:
        print(f"reaper: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        json.dump(plan_json(plan), out, indent=2, sort_keys=False)
        out.write("\n")
    elif args.format == "html":
        from reaper.report.views import whatif_page

        out.write(whatif_page(plan, Limits.of(config)))
    else:
        write_table(plan, out, Limits.of(config))
    return 0


def _alert_rules(args: argparse.Namespace, out: TextIO) -> int:
    from reaper.alert_rules import render

    path = config_path(args.config)
    here = Path.cwd()
    out.write(render(load_config(path), str(path.relative_to(here) if path.is_relative_to(here) else path)))
    return 0


def _config_reference(args: argparse.Namespace, out: TextIO) -> int:
    """The config reference generated from the model (:mod:`reaper.config_reference`), printed or written."""
    from reaper import config_reference

    if not args.write:
        out.write(config_reference.table())
        return 0
    try:
        config_reference.write(Path(args.write))
    except (OSError, ValueError) as exc:
        print(f"reaper: {exc}", file=sys.stderr)
        return 2
    return 0


def _approve(args: argparse.Namespace, out: TextIO) -> int:
    """Approve a held sweep's candidates from the ledger (:func:`reaper.approvals.approve`); the id on stdout, for
    scripts (``--conf '{"approval": "<id>"}'``), the rest on stderr."""
    from reaper.approvals import approve
    from reaper.durations import parse_duration

    def made(ledger: Ledger, user: str, now: float) -> Approval:
        expires_in = parse_duration(args.expires)
        return approve(ledger, args.dag, args.run, args.item, user, args.reason, expires_in, now)

    approval = _on_ledger(args, made)
    if isinstance(approval, int):
        return approval
    out.write(approval.id + "\n")
    print(
        f"reaper: approved {len(approval.items)} held deletes of {args.dag}/{args.run} until "
        f"{_iso(approval.expires_at)}; trigger {args.dag} with approval={approval.id}",
        file=sys.stderr,
    )
    return 0


def _on_ledger(args: argparse.Namespace, call: Callable[[Ledger, str, float], Approval]) -> Approval | int:
    """Run an approvals command on the config's ledger as the CLI's user (``--user``, else ``cli:<login>``), now;
    the exit status when it fails: 2 for a bad argument, 1 when the ledger does not answer, one line on stderr."""
    import getpass
    import time

    from pymongo.errors import PyMongoError

    from reaper.ledger import Ledger

    config = load_config(config_path(args.config))
    try:
        return call(Ledger.connect(config.ledger), args.user or f"cli:{getpass.getuser()}", time.time())
    except ValueError as exc:
        print(f"reaper: {exc}", file=sys.stderr)
        return 2
    except PyMongoError as exc:
        print(f"reaper: the ledger ({config.ledger.conn_id}) did not answer: {type(exc).__name__}", file=sys.stderr)
        return 1


def _revoke(args: argparse.Namespace, out: TextIO) -> int:
    """Revoke an approval in the ledger (:func:`reaper.approvals.revoke`)."""
    from reaper.approvals import revoke

    approval = _on_ledger(args, lambda ledger, user, now: revoke(ledger, args.approval, user, args.reason, now))
    if isinstance(approval, int):
        return approval
    used = approval.used_by
    state = (
        f"used by {used.dag_id}/{used.run_id}: it sends nothing more within half a second (its batch reads the "
        "approval with the sweep lease every 0.5 s); the sends under way finish"
        if used
        else "unused: no run may use it"
    )
    out.write(f"reaper: revoked approval {approval.id} of {approval.dag_id}, from {approval.run_id} ({state})\n")
    return 0


def _check(args: argparse.Namespace, out: TextIO) -> int:
    """The preflight (:mod:`reaper.preflight`), one line per check; 1 when any failed."""
    from reaper.preflight import preflight

    checks = preflight(load_config(config_path(args.config)))
    for check in checks:
        out.write(check.line() + "\n")
    failed = sum(not c.ok for c in checks)
    out.write(f"{len(checks) - failed} ok, {failed} failed\n")
    return 1 if failed else 0


def _metrics_retire(args: argparse.Namespace, out: TextIO) -> int:
    """Delete the target's metric groups (every one, or the named scopes'): nothing pushes them any more."""
    from reaper.metrics import retire
    from reaper.redact import error_for_log

    config = load_config(config_path(args.config))
    url = config.metrics.pushgateway_url
    if not url:
        print("reaper: metrics.pushgateway_url is empty in the config: no Pushgateway to retire from", file=sys.stderr)
        return 2
    try:
        retired = retire(url, args.target, config.metrics.timeout.total_seconds(), scopes=args.scope)
    except OSError as exc:
        print(f"reaper: the Pushgateway did not answer: {error_for_log(exc)}", file=sys.stderr)
        return 1
    for labels in retired.gone:
        out.write(_grouping(labels) + "\n")
    for labels in retired.failed:  # the error is in the log line above
        print(f"reaper: could not delete the group {_grouping(labels)}", file=sys.stderr)
    return 1 if retired.failed else 0


def _grouping(labels: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


class Inputs(NamedTuple):
    """What the policy is evaluated on: resources, evidence and the time."""

    resources: list[Resource]
    evidence: Evidence
    now: datetime


_EXPORTS = ("gce", "k8s", "runs", "leases", "writer_health")


def _inputs(args: argparse.Namespace, configs: Sequence[Settings]) -> Inputs:
    """The exports and evidence files, or the recorded sweep input; ``configs``: those the input is read for."""
    if args.recorded:
        given = [f"--{name.replace('_', '-')}" for name in _EXPORTS if getattr(args, name)]
        if given:
            raise decoders.InputError(
                f"invalid input {args.recorded} (--recorded): a recorded sweep input is the whole input "
                f"(resources and evidence), not to be combined with {', '.join(given)}"
            )
        data = decoders.load_recorded(args.recorded)
        as_of = data.as_of or data.evidence.observed_until  # a file recorded before as_of: when it was read
        now = args.now or (datetime.fromtimestamp(as_of, UTC) if as_of is not None else datetime.now(UTC))
        return Inputs(data.resources, data.evidence, now)
    resources: list[Resource] = []
    for path in args.gce:
        resources.extend(decoders.load_gce(path))
    for path in args.k8s:
        resources.extend(decoders.load_k8s(path, args.cluster))
    evidence = Evidence(
        writer_health=decoders.load_writer_health(args.writer_health) if args.writer_health else None,
        leases=decoders.load_leases(args.leases) if args.leases else None,
        runs=decoders.load_runs(args.runs, _run_keys(resources, configs)) if args.runs else None,
    )
    return Inputs(resources, evidence, args.now or datetime.now(UTC))


def _run_keys(resources: list[Resource], configs: Sequence[Settings]) -> set[str]:
    """The run keys the --k8s objects carry under each config's run label: what the run store is asked about."""
    labels = {config.k8s.run_label for config in configs}
    return {key for r in resources if isinstance(r, K8sObject) for label in labels if (key := r.labels.get(label))}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def resource_json(target: str, r: Resource) -> dict[str, object]:
    return {"target": target, "scope": r.scope, "kind": r.kind, "location": r.location, "name": r.name, "uid": r.uid}


def _verdict_json(d: Decision) -> dict[str, object]:
    return {"action": d.action.value, "rule": d.rule, "reason": d.reason, "evidence": d.evidence}


def decision_json(d: Decision) -> dict[str, object]:
    return {**resource_json(d.target, d.resource), **_verdict_json(d)}


def _order(d: Decision) -> tuple[str, str, str, str, str]:
    return place(d.target, d.resource)


def plan_json(plan: Plan) -> dict[str, object]:
    return {
        "phase": plan.phase.value,
        "now": _iso(plan.now),
        "decisions": [decision_json(d) for d in sorted(plan.decisions, key=_order)],
        "scopes": [v.as_dict() for v in plan.scopes],
        "census": plan.census,
        "capped": plan.capped,
    }


def write_table(plan: Plan, out: TextIO, limits: Limits | None = None) -> None:
    """A summary for people: one line per scope, then every decision that is not keep, its reason as a code
    (to grep for) and in words (the sentence the HTML report and the audit view show, ``limits`` quoted)."""
    from reaper.report.reasons import explain

    counts: Counter[tuple[str, str, Action]] = Counter((d.target, d.scope, d.action) for d in plan.decisions)
    out.write(f"phase {plan.phase.value} at {_iso(plan.now)}\n\n")
    rows: list[tuple[str, ...]] = [("TARGET", "SCOPE", "VERDICT", "KEEP", "REPORT", "DELETE")]
    for v in plan.scopes:
        verdict = ",".join(v.holds) or "ok"
        if v.overridden:
            verdict += f" (overridden: {','.join(v.overridden)})"
        actions = (Action.KEEP, Action.REPORT, Action.DELETE)
        rows.append((v.target, v.scope, verdict, *(str(counts[v.target, v.scope, a]) for a in actions)))
    _columns(rows, out)
    for target, would_delete in plan.capped.items():
        out.write(f"\n{target}: {would_delete} deletions exceed max_deletions_per_sweep; all reported instead\n")
    acted = sorted((d for d in plan.decisions if d.action is not Action.KEEP), key=_order)
    if acted:
        out.write("\n")
        rows = [("ACTION", "TARGET", "SCOPE", "KIND", "LOCATION", "NAME", "RULE", "REASON", "WHY")]
        for d in acted:
            r = d.resource
            why = explain(d.reason, d.evidence, limits)
            rows.append((d.action.value, d.target, r.scope, r.kind, r.location, r.name, d.rule or "", d.reason, why))
        _columns(rows, out)


# --- reaper diff ------------------------------------------------------------------------------

DANGEROUS = 3  # the exit status of a diff whose new config deletes what may be alive
ALIVE = "liveness evidence is fresh or unknown"


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    """Both configs on one input; the changes as a table, JSON or a page; 3 if any is dangerous."""
    from reaper.diff import diff
    from reaper.report.reasons import Limits

    old, new = load_config(args.old), load_config(args.new)
    data = _inputs(args, [old, new])
    phase = None if args.phase == "active" else Phase(args.phase)
    result = diff(data.resources, data.evidence, old, new, phase, data.now, recorded=bool(args.recorded))
    paths = (args.old, args.new)
    limits = {"old": Limits.of(old), "new": Limits.of(new)}
    if args.format == "json":
        json.dump(diff_json(result, paths), out, indent=2)
        out.write("\n")
    elif args.format == "html":
        from reaper.report.diff import diff_page

        out.write(diff_page(result, paths, limits))
    else:
        write_diff(result, paths, limits, out)
    return DANGEROUS if result.fails else 0


def diff_json(result: ConfigDiff, paths: tuple[str, str]) -> dict[str, object]:
    sides = {"old": result.old, "new": result.new}
    return {
        "now": _iso(result.now.timestamp()),
        **{
            name: {"config": path, "phases": {t: p.value for t, p in side.phases.items()}, "capped": side.capped}
            for (name, side), path in zip(sides.items(), paths, strict=True)
        },
        "changes": [change_json(c) for c in result.changes],
        "dangerous": len(result.dangerous),
        "unlisted": result.unlisted,
    }


def change_json(c: Change) -> dict[str, object]:
    reading = c.liveness
    return {
        **resource_json(c.target, c.resource),
        "old": _verdict_json(c.old) if c.old else None,
        "new": _verdict_json(c.new) if c.new else None,
        "liveness": None if reading is None else {**msgspec.structs.asdict(reading), "read_by": c.read_by},
        "widens": c.widens,
        "dangerous": c.dangerous,
    }


def write_diff(result: ConfigDiff, paths: tuple[str, str], limits: dict[str, Limits], out: TextIO) -> None:
    """For people and CI logs: the phases, one line per change (``!``: dangerous), then the verdict."""
    old, new = result.old, result.new
    out.write(f"reaper diff {paths[0]} -> {paths[1]} at {_iso(result.now.timestamp())}\n")
    moves = ", ".join(f"{t} {old.phases[t].value} -> {new.phases[t].value}" for t in old.phases)
    out.write(f"phases: {moves}\n")
    for name, side in (("old", old), ("new", new)):
        for target, would_delete in side.capped.items():
            out.write(f"{name}: {target}: {would_delete} deletions exceed max_deletions_per_sweep; all reported\n")
    if result.unlisted:
        out.write(
            f"\nthe recorded input was listed under the old config's selection; the new config also takes in "
            f"(exit {DANGEROUS}, diff on exports listed without these limits to see what it would delete):\n"
        )
        out.writelines(f"  {what}\n" for what in result.unlisted)
    if not result.changes:
        out.write("\nno decision changes\n")
        return
    out.write("\n")
    rows: list[tuple[str, ...]] = [
        ("!", "TARGET", "SCOPE", "KIND", "LOCATION", "NAME", "OLD", "NEW", "LIVENESS", "WHY")
    ]
    for c in result.changes:
        r = c.resource
        flag = "!" if c.dangerous else ""
        state, why = _liveness(c, limits)
        rows.append((flag, c.target, r.scope, r.kind, r.location, r.name, _side(c.old), _side(c.new), state, why))
    _columns(rows, out)
    dangerous = result.dangerous
    count = f"{len(result.changes)} decision change{'s' if len(result.changes) != 1 else ''}"
    if not dangerous:
        out.write(f"\n{count}; none deletes a resource the old config kept while its {ALIVE}\n")
        return
    out.write(
        f"\n{count}; {len(dangerous)} would delete a resource the old config kept while its {ALIVE} "
        f"(exit {DANGEROUS}):\n"
    )
    for c in dangerous:
        r = c.resource
        state, why = _liveness(c, limits)
        out.write(f"  {c.target} {r.scope} {r.kind} {r.location}/{r.name}: {state}, {why}\n")


def _side(d: Decision | None) -> str:
    """``delete heartbeat_stale``; ``-`` when that config does not decide the resource (not selected, disabled)."""
    return "-" if d is None else f"{d.action.value} {d.reason}"


def _liveness(c: Change, limits: dict[str, Limits]) -> tuple[str, str]:
    """The reading's state, and why in words, with the thresholds of the config that read it (``old:``)."""
    from reaper.report.reasons import explain

    reading = c.liveness
    if reading is None:
        return "unknown", "no rule reads a liveness for this kind"
    return reading.state.value, f"{c.read_by}: {explain(reading.reason, reading.evidence, limits[c.read_by])}"


def _columns(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
