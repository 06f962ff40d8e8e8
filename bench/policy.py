"""Benchmark of the pure policy (``python bench/policy.py``; ``make bench``).

(a) Evaluate 1,000,000 already-normalized GCE instances over 500 projects plus
    100,000 Kubernetes objects. Reports decisions per second and the ratio to a
    minimal loop, measured in the same run, that only reads each instance's
    heartbeat label and compares it with the quarantine cutoff: the floor for
    any policy that must look at every instance in Python.
(b) Parse and normalize a 100,000-instance ``gcloud compute instances list
    --format=json`` export (realistic, pretty-printed resources) and evaluate
    it, in a fresh subprocess so its peak RSS is its own.

Figures go to docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

from include.emulators.shapes import gcloud_instance  # noqa: E402
from reaper import decoders  # noqa: E402
from reaper.config import parse_settings  # noqa: E402
from reaper.model import Evidence, GceInstance, K8sObject, Keyed, Phase, WriterRecord  # noqa: E402
from reaper.policy import evaluate  # noqa: E402

NOW_DT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NOW = NOW_DT.timestamp()
HB = "runner_manager_heartbeat"
CONFIG = parse_settings({}, "defaults")
QUARANTINE = CONFIG.gce.quarantine.total_seconds()


def synthetic_instances(count: int, projects: int, seed: int = 1) -> list[GceInstance]:
    """A fleet that looks like production: mostly fresh, 2% stale, 1% TERMINATED, 1% unlabeled."""
    rnd = random.Random(seed)
    fleet = []
    for i in range(count):
        roll = rnd.random()
        labels = {"ci_ephemeral": "true", "runner_manager": f"mgr-{i % 7}"}
        status, last_stop = "RUNNING", None
        if roll < 0.02:
            labels[HB] = str(int(NOW - QUARANTINE - rnd.randint(60, 86400)))
        elif roll < 0.03:
            labels[HB] = str(int(NOW - rnd.randint(0, 3600)))
            status, last_stop = "TERMINATED", NOW - rnd.randint(0, 7200)
        elif roll >= 0.99:
            pass  # unlabeled
        else:
            labels[HB] = str(int(NOW - rnd.randint(0, 900)))
        fleet.append(
            GceInstance(
                project=f"ci-project-{i * projects // count:03d}",  # contiguous, as listed per project
                zone=f"us-east1-{'bcd'[i % 3]}",
                name=f"runner-{i:07d}",
                id=str(7_000_000_000_000_000_000 + i),
                status=status,
                labels=labels,
                created=NOW - rnd.randint(600, 4 * 86400),
                last_stop=last_stop,
            )
        )
    return fleet


def synthetic_objects(runs: int, seed: int = 2) -> list[K8sObject]:
    rnd = random.Random(seed)
    objects = []
    for r in range(runs):
        labels = {"iterion.io/managed": "true", "iterion.io/run-id": f"run-{r:06d}"}
        created = NOW - rnd.randint(60, 7200)
        for kind, n in (("Pod", 1), ("Secret", 2), ("NetworkPolicy", 1)):
            for j in range(n):
                containers = {"sandbox": False, "results-egress": False} if kind == "Pod" else {}
                objects.append(
                    K8sObject(
                        kind,
                        "ci-cluster",
                        "ci",
                        f"{kind.lower()}-{r}-{j}",
                        f"{r}-{kind}-{j}",
                        labels,
                        created,
                        containers=containers,
                    )
                )
    return objects


def evidence_for(instances: list[GceInstance], objects: list[K8sObject]) -> Evidence:
    projects = {i.project for i in instances}
    run_keys = sorted({o.labels["iterion.io/run-id"] for o in objects})
    held: dict[str, float | None] = dict.fromkeys(run_keys[: int(len(run_keys) * 0.95)])
    return Evidence(
        writer_health=[WriterRecord(f"mgr-{p}", p, NOW - 120, False) for p in projects],
        leases=Keyed(known=held, complete=True),
        runs=Keyed(known=dict.fromkeys(run_keys, "failed"), complete=True),
    )


def minimal_loop(instances: list[GceInstance]) -> int:
    """The floor: read the heartbeat label and compare it, nothing else."""
    cutoff = NOW - QUARANTINE
    stale = 0
    for inst in instances:
        raw = inst.labels.get(HB)
        if raw is not None and int(raw) < cutoff:
            stale += 1
    return stale


def best_of(runs: int, fn, *args):
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, result


def part_a(instances_n: int, projects: int, runs: int) -> dict[str, object]:
    instances = synthetic_instances(instances_n, projects)
    objects = synthetic_objects(runs)
    evidence = evidence_for(instances, objects)
    floor_s, _ = best_of(3, minimal_loop, instances)
    gce_s, plan = best_of(3, lambda: evaluate(instances, evidence, CONFIG, Phase.ENFORCEMENT, NOW_DT))
    both_s, both = best_of(3, lambda: evaluate([*instances, *objects], evidence, CONFIG, Phase.ENFORCEMENT, NOW_DT))
    assert len(plan.decisions) == instances_n and len(both.decisions) == instances_n + len(objects)
    return {
        "instances": instances_n,
        "projects": projects,
        "k8s_objects": len(objects),
        "gce_deletes": sum(1 for d in plan.deletes()),
        "minimal_loop_s": floor_s,
        "gce_evaluate_s": gce_s,
        "gce_ratio_to_minimal": gce_s / floor_s,
        "gce_decisions_per_s": instances_n / gce_s,
        "all_evaluate_s": both_s,
        "all_decisions_per_s": (instances_n + len(objects)) / both_s,
    }


def stages(instances_n: int, projects: int) -> list[tuple[str, float]]:
    """Each stage of the GCE policy timed alone on the fleet of (a) (best of 5): what bounds the ratio."""
    import gc
    from collections import Counter

    from reaper.policy import gce

    instances = synthetic_instances(instances_n, projects)
    evidence = evidence_for(instances, [])
    t = gce._Thresholds(CONFIG, NOW, None)
    groups = gce._first_pass(instances, CONFIG, t)

    def classify() -> None:
        for group in groups.values():
            findings: Counter[str] = Counter()
            for inst in group.rare:
                gce._classify(inst, t, findings)

    def without_gc() -> object:
        gc.disable()
        try:
            return evaluate(instances, evidence, CONFIG, Phase.ENFORCEMENT, NOW_DT)
        finally:
            gc.enable()

    timed = [
        ("minimal loop", lambda: minimal_loop(instances)),
        ("first pass", lambda: gce._first_pass(instances, CONFIG, t)),
        ("heartbeat-age histogram", lambda: [gce._age_histogram(list(g.beats), NOW) for g in groups.values()]),
        ("rare instances classified", classify),
        ("duplicate ids", lambda: [g.duplicated() for g in groups.values()]),
        ("status census", lambda: [Counter(map(gce._STATUS, g.instances())) for g in groups.values()]),
        ("evaluate, whole", lambda: evaluate(instances, evidence, CONFIG, Phase.ENFORCEMENT, NOW_DT)),
        ("evaluate, collector off", without_gc),
    ]
    return [(name, best_of(5, fn)[0]) for name, fn in timed]


def write_export(path: Path, count: int, projects: int) -> None:
    rnd = random.Random(3)
    fleet = synthetic_instances(count, projects)
    with path.open("w") as f:
        f.write("[\n")
        for i, inst in enumerate(fleet):
            offset = rnd.choice([-7, 0, 2])
            raw = gcloud_instance(
                inst.project,
                inst.zone,
                inst.name,
                int(inst.id),
                inst.status,
                inst.labels,
                inst.created,
                inst.last_stop,
                offset_hours=offset,
            )
            text = json.dumps(raw, indent=2)
            f.write(("  " + text.replace("\n", "\n  ")) + (",\n" if i < count - 1 else "\n"))
        f.write("]\n")


def peak_rss_mb() -> float:
    """This process's peak RSS. Not ``ru_maxrss``: Linux carries that across fork and exec, so
    a child would report its parent's peak. ``VmHWM`` belongs to the process's own memory map."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def part_b_child(path: str) -> None:
    """Runs in a fresh process: parse, normalize and evaluate; print timing and peak RSS."""
    start = time.perf_counter()
    instances = decoders.load_gce(path)
    parsed = time.perf_counter()
    writers = [WriterRecord("m", p, NOW - 60, False) for p in {i.project for i in instances}]
    plan = evaluate(instances, Evidence(writer_health=writers), CONFIG, Phase.ENFORCEMENT, NOW_DT)
    done = time.perf_counter()
    rss_mb = peak_rss_mb()
    print(
        json.dumps(
            {
                "parse_normalize_s": parsed - start,
                "evaluate_s": done - parsed,
                "total_s": done - start,
                "decisions": len(plan.decisions),
                "peak_rss_mb": rss_mb,
            }
        )
    )


def part_b(count: int, projects: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "instances.json"
        write_export(path, count, projects)
        size_mb = path.stat().st_size / 2**20
        # Baseline RSS: the same interpreter with the same imports, doing nothing.
        base = subprocess.run([sys.executable, __file__, "--rss-baseline"], capture_output=True, text=True, check=True)
        child = subprocess.run(
            [sys.executable, __file__, "--child", str(path)], capture_output=True, text=True, check=True
        )
    result = json.loads(child.stdout)
    result.update({"instances": count, "export_mb": size_mb, "baseline_rss_mb": float(base.stdout)})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1_000_000)
    parser.add_argument("--projects", type=int, default=500)
    parser.add_argument("--runs", type=int, default=25_000, help="Kubernetes runs (4 objects each)")
    parser.add_argument("--export-instances", type=int, default=100_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rss-baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stages", action="store_true", help="time each stage of the GCE policy alone")
    args = parser.parse_args()
    if args.stages:
        timed = stages(args.instances, args.projects)
        floor = timed[0][1]
        for name, seconds in timed:
            print(f"{name:28s} {seconds:6.3f} s  {seconds / floor:5.2f}x the minimal loop")
        return
    if args.child:
        part_b_child(args.child)
        return
    if args.rss_baseline:
        print(peak_rss_mb())
        return
    cpu = platform.processor() or platform.machine()
    print(f"# machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}")
    a = part_a(args.instances, args.projects, args.runs)
    print(
        f"(a) {a['instances']:,} GCE instances over {a['projects']} projects "
        f"(+ {a['k8s_objects']:,} Kubernetes objects)"
    )
    print(f"    minimal loop (read heartbeat label, compare): {a['minimal_loop_s']:.3f} s")
    print(
        f"    policy, GCE only:   {a['gce_evaluate_s']:.3f} s = {a['gce_decisions_per_s']:,.0f} decisions/s, "
        f"{a['gce_ratio_to_minimal']:.2f}x the minimal loop  (target: < 1.5 s, < 5x)"
    )
    print(f"    policy, GCE + k8s:  {a['all_evaluate_s']:.3f} s = {a['all_decisions_per_s']:,.0f} decisions/s")
    b = part_b(args.export_instances, max(1, args.projects // 5))
    print(
        f"(b) gcloud export of {b['instances']:,} instances ({b['export_mb']:.0f} MiB, pretty-printed as gcloud does)"
    )
    print(
        f"    parse + normalize {b['parse_normalize_s']:.3f} s, evaluate {b['evaluate_s']:.3f} s, "
        f"total {b['total_s']:.3f} s  (target: < 1.5 s)"
    )
    print(
        f"    peak RSS {b['peak_rss_mb']:.0f} MB (interpreter + imports alone: {b['baseline_rss_mb']:.0f} MB)"
        "  (target: < 600 MB)"
    )


if __name__ == "__main__":
    main()
