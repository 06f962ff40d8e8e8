"""Run the GCE emulator: ``python -m include.emulators.gce --port 8085 --seed include/samples/gce-instances.json``."""

from __future__ import annotations

import argparse
import time

from include.emulators.gce import Emulator, Fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8085)
    parser.add_argument("--seed", action="append", default=[], metavar="FILE", help="gcloud instances JSON export")
    parser.add_argument("--generate", nargs=3, type=int, metavar=("PROJECTS", "ZONES", "PER_PROJECT"))
    parser.add_argument("--orphaned", type=float, default=0.02, help="fraction of generated instances left stale")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND=CODE:RATE",
        help="e.g. delete=429:0.1 or aggregated_list=timeout:0.05 (kinds: aggregated_list, list, get, delete, "
        "set_labels, operation_get, operation_wait)",
    )
    parser.add_argument("--unreachable", action="append", default=[], metavar="PROJECT/ZONE")
    args = parser.parse_args()

    fleet = Fleet()
    for path in args.seed:
        fleet.load_gcloud_json(path)
    if args.generate:
        fleet.generate(*args.generate, now=time.time(), orphaned=args.orphaned)
    fleet.faults.latency = args.latency
    for spec in args.fault:
        kind, _, rest = spec.partition("=")
        code, _, rate = rest.partition(":")
        fleet.faults.rates.setdefault(kind, {})[code] = float(rate)
    for spec in args.unreachable:
        project, _, zone = spec.partition("/")
        fleet.faults.unreachable.add((project, zone))

    emulator = Emulator(fleet, args.host, args.port)
    emulator.serve_until_stopped(f"GCE emulator on {emulator.endpoint} ({len(fleet.names())} instances)")


if __name__ == "__main__":
    main()
