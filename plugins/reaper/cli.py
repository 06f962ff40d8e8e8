"""The reaper's command line: what-if runs of the policy, the preflight, the alert rules, metric clean-up.

``reaper evaluate`` calls the same :func:`reaper.policy.evaluate` as the DAGs, so what it prints
is exactly what that phase would report and delete given the same evidence; it never deletes
anything. Exit 0 on success, 2 on invalid config or input (one message on stderr, nothing on
stdout); ``reaper check`` exits 1 when a check fails. Output cut short by its reader (``| head``)
ends quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn, TextIO

from reaper import __version__, exports
from reaper.config import ConfigError, Settings, config_path, load_config
from reaper.model import Action, Decision, Evidence, K8sObject, Phase, Plan, Resource
from reaper.policy import evaluate
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
    ev = commands.add_parser("evaluate", help="what-if: evaluate a phase's policy on fleet exports")
    ev.add_argument("--config", help="config file (default: $REAPER_CONFIG, else include/reaper.yaml)")
    ev.add_argument("--now", type=_timestamp, help="evaluation time, RFC 3339 (default: the current time)")
    ev.add_argument("--phase", choices=[p.value for p in Phase], default=Phase.REPORT_ONLY.value, help="rollout phase")
    ev.add_argument("--gce", action="append", default=[], metavar="FILE", help="gcloud instances JSON export")
    ev.add_argument("--k8s", action="append", default=[], metavar="FILE", help="kubectl List JSON export")
    ev.add_argument("--cluster", default="default", help="scope name of the --k8s objects (default: default)")
    ev.add_argument("--runs", metavar="FILE", help="run-store documents; omitted: the store is unknown")
    ev.add_argument("--leases", metavar="FILE", help="run keys whose lease is held; omitted: leases unknown")
    ev.add_argument("--writer-health", metavar="FILE", help="heartbeat-writer reports; omitted: unknown")
    ev.add_argument(
        "--format",
        choices=["json", "table", "html"],
        default="table",
        help="html: one self-contained page (charts, every finding with its reason in words) to share for review",
    )
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
    reference = commands.add_parser(
        "config-reference", help="every config key with its type, default and description, as a Markdown table"
    )
    reference.add_argument(
        "--write", metavar="FILE", help="replace the table between the markers in FILE (docs/reference.md) instead"
    )
    return parser


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
        if args.command == "config-reference":
            return _config_reference(args, out)
        config = load_config(config_path(args.config))
        plan = _evaluate(args, config)
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
        gone = retire(url, args.target, config.metrics.timeout.total_seconds(), scopes=args.scope)
    except OSError as exc:
        print(f"reaper: the Pushgateway did not answer: {error_for_log(exc)}", file=sys.stderr)
        return 1
    for labels in gone:
        out.write(" ".join(f"{k}={v}" for k, v in sorted(labels.items())) + "\n")
    return 0


def _evaluate(args: argparse.Namespace, config: Settings) -> Plan:
    resources: list[Resource] = []
    for path in args.gce:
        resources.extend(exports.load_gce(path))
    for path in args.k8s:
        resources.extend(exports.load_k8s(path, args.cluster))
    evidence = Evidence(
        writer_health=exports.load_writer_health(args.writer_health) if args.writer_health else None,
        leases=exports.load_leases(args.leases) if args.leases else None,
        runs=exports.load_runs(args.runs, _run_keys(resources, config)) if args.runs else None,
    )
    now = args.now or datetime.now(UTC)
    return evaluate(resources, evidence, config, Phase(args.phase), now)


def _run_keys(resources: list[Resource], config: Settings) -> set[str]:
    """The run keys the --k8s objects carry: what the run store is asked about."""
    label = config.k8s.run_label
    return {key for r in resources if isinstance(r, K8sObject) and (key := r.labels.get(label))}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def decision_json(d: Decision) -> dict[str, object]:
    r = d.resource
    return {
        "target": d.target,
        "scope": r.scope,
        "kind": r.kind,
        "location": r.location,
        "name": r.name,
        "uid": r.uid,
        "action": d.action.value,
        "rule": d.rule,
        "reason": d.reason,
        "evidence": d.evidence,
    }


def _order(d: Decision) -> tuple[str, str, str, str, str]:
    r = d.resource
    return (d.target, r.scope, r.location, r.kind, r.name)


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
    rows = [("TARGET", "SCOPE", "VERDICT", "KEEP", "REPORT", "DELETE")]
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


def _columns(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
