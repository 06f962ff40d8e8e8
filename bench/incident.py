"""Benchmark of the quota incident's recovery at full scale (``python bench/incident.py``; docs/design.md §6).

Ten projects with live managers; the managers of two crash-looped and abandoned 8,000 VMs between
them (heartbeats 5 h old, their writers passing again with empty stores). Through the real
``reaper_gce_enforcement`` DAG (``dag.test()``), against the GCE emulator in its own process (20 ms
latency), a real Prometheus (writer health) and SecantusDB (the ledger):

1. the scheduled sweep: the two projects held on their budget, the other eight enforced;
2. the recovery: ``reaper approve --all`` of the held set the scheduled sweep lists, then one manual
   run with ``approval=<id>`` and ``scopes`` (the two held projects), and, if its deadline left some,
   the runs after it, each with an approval of what the last one left (``--recover override``: the
   blunter ``override_budget``, ``override_scopes``, ``override_reason`` and ``max_deletions``).

The emulator enforces the Compute API's rate quotas (``--quota-limit`` per group and minute in each
project, the reaper configured with the same limits and ``--share``). Prints the time from the
recovery's trigger to the last deletion against its bound, the slower of the rate limit,
``abandoned / (projects x delete_rate_per_project)``, and the quota share,
``abandoned / (projects x share x limit / 60 s)`` (a delete is a read, a mutation and an operation
read); the busiest second of each project (the rate plus the one banked token, timed by the sent marks'
commits: a group commit writes a cycle's sends together, so a second may count one or two more); the most
the reaper spent of any group in any minute of a project, against its share; and what each run left
for the next. The default limit, 6,000 a minute, is a project whose quota was raised for a fleet this
size: at the documented 1,500 the share allows 5 deletes a second per project, and 8,000 take 800 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun
    from pymongo.database import Database

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "plugins"), str(Path(__file__).resolve().parents[1])]
from bench.sweep import HOME, ROOT, STEPS, Meter, configure, ledger_calls, writers  # noqa: E402  (sets AIRFLOW_HOME: import it before Airflow)
from include.emulators.http import free_port, start_secantusdb  # noqa: E402
from include.emulators.shapes import gcloud_instance  # noqa: E402
from tests.helpers.gce import busiest_second  # noqa: E402
from tests.integration.prometheus import Prometheus  # noqa: E402

HEARTBEAT = "runner_manager_heartbeat"
REASON = "INC-13578 replay: runner managers OOM crash-looped and abandoned their VMs"


def seed(path: Path, projects: list[str], crashed: list[str], live: int, abandoned: int) -> tuple[int, int]:
    """A gcloud export of the fleet: live VMs everywhere, one orphan per healthy project, the crashed ones' VMs."""
    now, instances, n = time.time(), [], 0
    for project in projects:
        for kind, count, age in (("live", live, 60), ("gone", abandoned if project in crashed else 1, 5 * 3600)):
            for i in range(count):
                n += 1
                labels = {"ci_ephemeral": "true", HEARTBEAT: str(int(now - age))}
                zone = f"us-east1-{'bcd'[i % 3]}"
                instances.append(
                    gcloud_instance(project, zone, f"{project}-{kind}-{i}", n, "RUNNING", labels, now - 86400)
                )
    path.write_text(json.dumps(instances))
    return len(projects) * live, len(instances) - len(projects) * live


QUOTA_GROUPS = ("list_requests", "read_requests", "mutation_requests", "operation_read_requests")


def start_emulator(seed_file: Path, latency: float, limit: int) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "include.emulators.gce", "--port", str(port), "--latency", str(latency)]
    cmd += [arg for group in QUOTA_GROUPS for arg in ("--quota", f"{group}={limit}")]
    process = subprocess.Popen([*cmd, "--seed", str(seed_file)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout else ""
    if "GCE emulator on" not in line:
        process.kill()
        raise RuntimeError(f"emulator did not start: {line!r}")
    return process, line.split()[3]


def quota_spent(endpoint: str) -> tuple[dict[tuple[float, str, str], int], int]:
    """(minute, project, group) -> requests the emulator admitted from the reaper; and how many of the reaper's
    it refused as over a used-up quota (its share should never meet one)."""
    import requests

    usage = requests.get(f"{endpoint}/_emulator/stats", timeout=30).json()["quota_usage"]
    mine = [u for u in usage if u["caller"] == "reaper"]
    return {(u["window"], u["project"], u["group"]): u["admitted"] for u in mine}, sum(u["refused"] for u in mine)


def run(dag_id: str, **conf: object) -> DagRun:
    from airflow.dag_processing.dagbag import DagBag

    return cast("DagRun", DagBag(dag_folder=str(ROOT / "dags")).dags[dag_id].test(run_conf=conf or None))


def stored_summary(db: Database[dict[str, Any]], run_id: str) -> dict[str, Any]:
    """The sweep summary the run wrote to the ledger."""
    summary = db.sweeps.find_one({"run_id": run_id})
    if summary is None:
        raise LookupError(f"run {run_id} wrote no sweep summary")
    return summary


def approve_all(dag_id: str, run_id: str) -> str:
    """``reaper approve --all`` of a sweep's held candidates, as an operator scripts it; the approval's id."""
    cmd = [str(Path(sys.executable).with_name("reaper")), "approve", "--dag", dag_id, "--run", run_id, "--all"]
    done = subprocess.run([*cmd, "--reason", REASON], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"reaper approve failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=10)
    parser.add_argument("--crashed", type=int, default=2)
    parser.add_argument("--abandoned", type=int, default=8000, help="VMs abandoned, over the crashed projects")
    parser.add_argument("--live", type=int, default=100, help="live VMs per project")
    parser.add_argument("--rate", type=float, default=20.0, help="gce.delete_rate_per_project")
    parser.add_argument("--latency", type=float, default=0.020)
    parser.add_argument("--quota-limit", type=int, default=6000, help="each rate-quota group's limit per minute")
    parser.add_argument("--share", type=float, default=0.2, help="gce.quota.share")
    parser.add_argument(
        "--recover",
        choices=["approval", "override"],
        default="approval",
        help="approve the held set (reaper approve --all), or lift the hold with override_budget (the code before "
        "approvals had only this)",
    )
    args = parser.parse_args()

    from pymongo import MongoClient

    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    projects = [f"ci-project-{p:02d}" for p in range(args.projects)]
    crashed = projects[: args.crashed]
    live, orphans = seed(HOME / "fleet.json", projects, crashed, args.live, args.abandoned // args.crashed)
    emulator, endpoint = start_emulator(HOME / "fleet.json", args.latency, args.quota_limit)
    mongo = start_secantusdb()
    mongo_port = cast(int, mongo.port)  # started on a port of its own
    (HOME / "prometheus").mkdir()
    prometheus = Prometheus(HOME / "prometheus", [f"127.0.0.1:{writers(projects)}"])
    try:
        prometheus.wait_for_writers(len(projects))
        os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"api_endpoint": endpoint, "anonymous": True}}
        )
        gce = {
            "projects": projects,
            "writer_health": {"prometheus_url": prometheus.url},
            "delete_rate_per_project": args.rate,
            "quota": {"limits": dict.fromkeys(QUOTA_GROUPS, args.quota_limit), "share": args.share},
        }
        configure(
            HOME,
            mongo_port,
            {
                "gce": gce,
                "k8s": {"enabled": False},
                "rollout": {"gce": "enforcement"},  # the swept phase is the active one
                "airflow": {"sweep_store": f"file://{HOME}/sweeps", "retries": 0},
                # SecantusDB (Python) takes seconds to upsert 8,000 decisions in one bulk write, more on a busy
                # machine; MongoDB takes well under one. The default 10 s would time the benchmark out, not the reaper.
                "ledger": {"timeout": "60s"},
            },
        )
        db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo.port}/", tz_aware=True)["reaper"]
        print(
            f"# {live:,} live VMs in {len(projects)} projects; {orphans:,} orphans, "
            f"{args.abandoned:,} of them in {crashed}"
        )

        started = time.perf_counter()
        held = run("reaper_gce_enforcement")
        summary = stored_summary(db, held.run_id)
        holds = {s["scope"]: s["holds"] for s in summary["scopes"] if s["holds"]}
        print(
            f"scheduled sweep: {time.perf_counter() - started:.1f} s, {held.state}; "
            f"holds {holds}; outcomes {summary['outcomes']}"
        )

        meter = Meter()  # from here: what each recovery run spent in the reaper's own steps
        triggered = time.time()
        runs: list[tuple[str | None, str, dict[str, int], Meter]] = []
        left, reviewed = args.abandoned, held.run_id
        while left and len(runs) < 5:
            if args.recover == "approval":  # the operator approves the held set the sweep page lists, as reviewed
                conf: dict[str, object] = {"approval": approve_all("reaper_gce_enforcement", reviewed)}
            else:  # the blunter tool: lift the hold for whatever the run finds in the projects
                conf = {
                    "override_budget": True,
                    "override_scopes": crashed,  # the projects the scheduled sweep held
                    "override_reason": REASON,
                    "max_deletions": args.abandoned,
                }
            recovery = run("reaper_gce_enforcement", **conf, scopes=crashed)
            summary = stored_summary(db, recovery.run_id)
            outcomes: Counter[str] = Counter(summary["outcomes"])
            taken = meter.take()
            runs.append((recovery.state, summary["why"], dict(outcomes), taken))
            left -= outcomes["deleted"]
            reviewed = recovery.run_id  # what a run left is held again: approved anew
        last = db.ledger.find_one(
            {"action": "outcome", "result": "deleted", "scope": {"$in": crashed}}, sort=[("at", -1)]
        )
        sent = [
            (r["scope"], r["at"].timestamp())
            for r in db.ledger.find({"action": "delete_intent", "sent": True, "scope": {"$in": crashed}})
        ]
        spent, refused = quota_spent(endpoint)
    finally:
        prometheus.stop()
        emulator.terminate()
        mongo.stop()

    took = last["at"].timestamp() - triggered if last else float("nan")
    allowance = int(args.quota_limit * args.share)
    rate_bound = args.abandoned / (args.crashed * args.rate)
    quota_bound = args.abandoned / (args.crashed * allowance / 60)
    bound = max(rate_bound, quota_bound)
    for i, (state, why, counts, taken) in enumerate(runs, 1):
        print(f"recovery run {i}: {state}; {why}; outcomes {counts}")
        print("  its steps: " + ", ".join(f"{step} {taken.seconds[step]:.1f} s" for step in STEPS))
        print("  its ledger calls outside the deletes: " + ledger_calls(taken))
    first = min((at for _, at in sent), default=float("nan"))
    print(
        f"trigger to the first send: {first - triggered:.1f} s (the approval, the DAG's tasks up to the deletes); "
        f"first send to the last deletion: {last['at'].timestamp() - first if last else float('nan'):.1f} s"
    )
    print(
        f"{args.recover} run triggered to last deletion: {took:.1f} s; bound {bound:.1f} s "
        f"(rate limit {rate_bound:.1f} s, quota share {quota_bound:.1f} s); ratio {took / bound:.2f}x"
    )
    most = max(spent.items(), key=lambda item: item[1], default=(("-", "-", "-"), 0))
    print(
        f"most the reaper spent of a group in a minute of a project: {most[1]} ({most[0][2]} in {most[0][1]}); "
        f"its share {allowance} of {args.quota_limit}; refused {refused}"
    )
    print(
        f"busiest second per project: {busiest_second(sent)} (rate {args.rate:g}/s + 1 banked token; timed by the "
        "sent marks' commits, which write a cycle's sends together, up to a cycle after them)"
    )
    print(f"abandoned VMs left: {left}")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(HOME, ignore_errors=True)
