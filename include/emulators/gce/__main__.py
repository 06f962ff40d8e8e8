"""Run the GCE emulator: ``python -m include.emulators.gce --port 8085 --seed include/samples/gce-instances.json``.

Rate quotas are off unless asked for: ``--quotas`` sets the documented ones (1,500 requests per minute per
project in each group), ``--quota read_requests=100`` one group's limit, ``--quota-window 10`` a shorter
window. ``--operation-seconds delete=30`` makes every delete take 30 s to be DONE, ``--slow get=2`` every
instances.get answer 2 s later (on top of ``--latency``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from include.emulators.gce import Emulator, Fleet
from include.emulators.gce.quota import GROUPS


def _pairs(specs: list[str], flag: str) -> dict[str, float]:
    """``["a=1", "b=2.5"]`` -> {a: 1.0, b: 2.5}; a malformed one stops with a message naming the flag."""
    parsed = {}
    for spec in specs:
        key, _, value = spec.partition("=")
        try:
            parsed[key] = float(value)
        except ValueError:
            key = ""
        if not key:
            raise SystemExit(f"{flag} {spec!r}: expected NAME=NUMBER")
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8085)
    parser.add_argument("--seed", action="append", default=[], metavar="FILE", help="gcloud instances JSON export")
    parser.add_argument("--generate", nargs=3, type=int, metavar=("PROJECTS", "ZONES", "PER_PROJECT"))
    parser.add_argument("--orphaned", type=float, default=0.02, help="fraction of generated instances left stale")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    kinds = ", ".join(GROUPS)
    parser.add_argument(
        "--slow", action="append", default=[], metavar="KIND=SECONDS", help=f"more latency for one kind ({kinds})"
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND=CODE:RATE",
        help=f"e.g. delete=429:0.1 or aggregated_list=timeout:0.05 (kinds: {kinds})",
    )
    parser.add_argument("--unreachable", action="append", default=[], metavar="PROJECT/ZONE")
    parser.add_argument("--quotas", action="store_true", help="the documented rate quotas: 1,500 per minute per group")
    parser.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="GROUP=LIMIT",
        help="a group's limit per window and project (list_requests, read_requests, mutation_requests, "
        "operation_read_requests); others unlimited unless --quotas",
    )
    parser.add_argument("--quota-window", type=float, default=None, metavar="SECONDS", help="60 by default")
    parser.add_argument(
        "--operation-seconds",
        action="append",
        default=[],
        metavar="TYPE=SECONDS",
        help="how long an operation takes to be DONE (delete, insert, setLabels); 0 by default",
    )
    parser.add_argument("--operation-wait-cap", type=float, default=None, metavar="SECONDS", help="120 by default")
    args = parser.parse_args()

    fleet = Fleet()
    for path in args.seed:
        fleet.load_gcloud_json(path)
    if args.generate:
        projects, zones, per_project = args.generate
        fleet.generate(projects, zones, per_project, now=time.time(), orphaned=args.orphaned)
    fleet.faults.latency = args.latency
    fleet.faults.slow.update(_pairs(args.slow, "--slow"))
    for spec in args.fault:
        kind, _, rest = spec.partition("=")
        code, _, rate = rest.partition(":")
        fleet.faults.rates.setdefault(kind, {})[code] = float(rate)
    for spec in args.unreachable:
        project, _, zone = spec.partition("/")
        fleet.faults.unreachable.add((project, zone))
    quotas: dict[str, Any] = {"documented": args.quotas, "limits": _pairs(args.quota, "--quota")}
    if args.quota_window is not None:
        quotas["window"] = args.quota_window
    try:
        fleet.quotas.configure(quotas)
    except ValueError as exc:
        raise SystemExit(f"--quota: {exc}") from None
    fleet.faults.operation_seconds.update(_pairs(args.operation_seconds, "--operation-seconds"))
    if args.operation_wait_cap is not None:
        fleet.faults.operation_wait_cap = args.operation_wait_cap

    emulator = Emulator(fleet, args.host, args.port)
    emulator.serve_until_stopped(f"GCE emulator on {emulator.endpoint} ({len(fleet.names())} instances)")


if __name__ == "__main__":
    main()
