"""Run the Kubernetes API emulator and write a kubeconfig for it.

``python -m include.emulators.k8s --port 8086 --seed include/samples/k8s-objects.json --kubeconfig /tmp/kubeconfig``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from include.emulators.k8s import RESOURCE_OF_KIND, K8sEmulator
from include.emulators.runs import RUN_KEY
from include.emulators.shapes import kube_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8086)
    parser.add_argument("--seed", action="append", default=[], metavar="FILE", help="kubectl List JSON export")
    parser.add_argument("--kubeconfig", metavar="FILE", help="write a kubeconfig pointing at the emulator here")
    parser.add_argument("--generate", type=int, default=0, metavar="RUNS", help="sandbox runs (4 objects each)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    args = parser.parse_args()

    emulator = K8sEmulator(host=args.host, port=args.port)
    for path in args.seed:
        for item in json.loads(Path(path).read_text())["items"]:
            resource = RESOURCE_OF_KIND.get(item.get("kind", ""))
            if resource:
                emulator.cluster.create(resource, item["metadata"].get("namespace", "default"), item)
    created = time.time() - 3600
    for r in range(args.generate):
        for obj in kube_run(RUN_KEY.format(r), "ci", created, {"iterion.io/managed": "true"}):
            emulator.cluster.create(RESOURCE_OF_KIND[obj["kind"]], "ci", obj)
    emulator.cluster.faults.latency = args.latency
    if args.kubeconfig:
        Path(args.kubeconfig).write_text(json.dumps(emulator.kubeconfig(), indent=2))
    emulator.serve_until_stopped(
        f"Kubernetes emulator on {emulator.endpoint} ({len(emulator.cluster.objects)} objects)"
    )


if __name__ == "__main__":
    main()
