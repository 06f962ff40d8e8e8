"""Writes the bundled sample exports (``python include/samples/generate.py``).

The samples are evaluated at ``SAMPLE_NOW`` (``make demo`` passes it as
``--now``). They cover every GCE and Kubernetes rule row, so a user sees what
each rollout phase does before enabling it. The expected outcome of each
resource is in its name; ``tests/unit/test_cli.py`` checks it for every phase.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from include.emulators.shapes import gcloud_instance, kube_pod, kube_run, kube_secret  # noqa: E402

SAMPLE_NOW = "2026-11-29T12:00:00Z"
NOW = datetime.fromisoformat(SAMPLE_NOW).timestamp()
M, H, D = 60, 3600, 86400
CI = {"ci_ephemeral": "true"}
MANAGED = {"iterion.io/managed": "true"}


def _hb(age: float) -> dict[str, str]:
    return {**CI, "runner_manager_heartbeat": str(int(NOW - age))}


def gce_fleet() -> list[dict[str, object]]:
    """Three projects: a healthy one with every rule row, one with a failing writer, one over budget."""
    rows = [
        # project, name, status, labels, created age, last stop age
        ("ci-runners-a", "a-fresh", "RUNNING", _hb(5 * M), 2 * D, None),
        ("ci-runners-a", "a-fresh-at-quarantine", "RUNNING", _hb(4 * H), 2 * D, None),
        ("ci-runners-a", "a-stale", "RUNNING", _hb(6 * H), 2 * D, None),
        ("ci-runners-a", "a-terminated", "TERMINATED", _hb(2 * H), 1 * D, 2 * H),
        ("ci-runners-a", "a-terminated-in-grace", "TERMINATED", _hb(5 * M), 1 * D, 5 * M),
        ("ci-runners-a", "a-future-heartbeat", "RUNNING", _hb(-1 * H), 1 * D, None),
        ("ci-runners-a", "a-malformed-old", "RUNNING", {**CI, "runner_manager_heartbeat": "yesterday"}, 5 * D, None),
        ("ci-runners-a", "a-unlabeled-old", "RUNNING", dict(CI), 4 * D, None),
        ("ci-runners-a", "a-unlabeled-young", "STAGING", dict(CI), 1 * D, None),
        ("ci-runners-a", "a-opted-out-stale", "RUNNING", {**_hb(9 * H), "reaper_keep": "true"}, 2 * D, None),
        ("ci-runners-a", "a-unselected-no-labels", "RUNNING", None, 9 * D, None),
        ("ci-runners-a", "a-unselected-other", "RUNNING", {"team": "web"}, 9 * D, None),
        ("ci-runners-b", "b-fresh", "RUNNING", _hb(2 * M), 1 * D, None),
        ("ci-runners-b", "b-fresh-2", "SUSPENDED", _hb(8 * M), 1 * D, None),
        ("ci-runners-b", "b-stale-writer-failing", "RUNNING", _hb(5 * H), 1 * D, None),
        ("ci-runners-c", "c-fresh", "RUNNING", _hb(1 * M), 1 * D, None),
        ("ci-runners-c", "c-stale-over-budget-1", "RUNNING", _hb(7 * H), 2 * D, None),
        ("ci-runners-c", "c-stale-over-budget-2", "STOPPING", _hb(7 * H), 2 * D, None),
        ("ci-runners-c", "c-stale-over-budget-3", "REPAIRING", _hb(8 * H), 2 * D, None),
        ("ci-runners-c", "c-stale-over-budget-4", "PROVISIONING", _hb(9 * H), 2 * D, None),
    ]
    zones = ["us-east1-b", "us-east1-c", "us-east1-d"]
    return [
        gcloud_instance(
            project,
            zones[i % 3],
            name,
            7_100_000_000_000_000_000 + i,
            status,
            labels,
            NOW - created,
            None if stop is None else NOW - stop,
            offset_hours=(-7, 0, 2)[i % 3],
        )
        for i, (project, name, status, labels, created, stop) in enumerate(rows)
    ]


def k8s_fleet() -> list[dict[str, object]]:
    old = NOW - 2 * H
    items: list[dict[str, object]] = []
    items += kube_run("run-live", "ci-sandboxes", old, MANAGED)
    items += kube_run("run-dead", "ci-sandboxes", old, MANAGED)
    items += kube_run("run-gone", "ci-sandboxes", old, MANAGED)
    items += kube_run("run-active", "ci-sandboxes", old, MANAGED)
    items += kube_run("run-egress", "ci-sandboxes", old, MANAGED, sidecar="results-egress", sidecar_terminated=False)
    items += kube_run("run-young", "ci-sandboxes", NOW - 1 * M, MANAGED)
    items += kube_run("run-protected", "kube-system", old, MANAGED)
    items.append(kube_secret("sandbox-stray-secret", "ci-sandboxes", "stray-secret", dict(MANAGED), old))
    items.append(kube_pod("unmanaged-web", "web", "unmanaged-web", {"app": "web"}, old))
    return items


def main() -> None:
    here = Path(__file__).parent
    _write(here / "gce-instances.json", gce_fleet())
    _write(
        here / "k8s-objects.json",
        {"apiVersion": "v1", "items": k8s_fleet(), "kind": "List", "metadata": {"resourceVersion": ""}},
    )
    _write(
        here / "runs.json",
        [
            {"_id": "run-live", "status": "running"},
            {"_id": "run-dead", "status": "failed"},
            {"_id": "run-active", "status": "running"},
            {"_id": "run-egress", "status": "succeeded"},
            {"_id": "run-young", "status": "running"},
            {"_id": "run-protected", "status": "succeeded"},
        ],
    )
    _write(here / "leases.json", ["run-live"])
    _write(
        here / "writer-health.json",
        [
            {"manager": "runner-manager-a1", "project": "ci-runners-a", "last_pass": NOW - 4 * M, "failing": False},
            {"manager": "runner-manager-a2", "project": "ci-runners-a", "last_pass": NOW - 9 * M, "failing": False},
            {"manager": "runner-manager-b1", "project": "ci-runners-b", "last_pass": NOW - 3 * M, "failing": True},
            {"manager": "runner-manager-c1", "project": "ci-runners-c", "last_pass": NOW - 2 * M, "failing": False},
        ],
    )


def _write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
