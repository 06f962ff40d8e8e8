"""Benchmark of whole sweeps through the real DAGs (``python bench/sweep.py``; ``make bench``).

Runs ``reaper_gce_enforcement`` (100,000 instances in 200 projects, 2% orphaned,
20 ms latency) and ``reaper_k8s_enforcement`` (20,000 runs = 80,000 objects, 5%
orphaned, 10 ms latency) with ``dag.test()`` against the emulators (their own
processes), a real Prometheus (writer health), real NATS (leases) and SecantusDB
(run store, ledger). Prints, per sweep: the wall time split into listing,
evidence, policy, deletion, ledger and the rest (Airflow: scheduling, task set-up,
XCom; and the DAG's glue: inventory files), each measured by timing the reaper's
own calls inside the tasks; API calls and store round trips against the lower
bounds of the adapter benchmarks; and the peak RSS of the heaviest step.

``dag.test()`` runs every task, mapped ones included, one after another in this
process: the listing shards that a real executor runs side by side run in series
here, so the listing figure is an upper bound of what a deployment sees.
``--executor celery --workers N`` sweeps the same fleets on N Celery workers instead
(``bench/celery_sweep.py``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]
HOME = Path(tempfile.mkdtemp(prefix="reaper-bench-airflow-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
)

import requests  # noqa: E402
from prometheus_client import CollectorRegistry, Gauge, start_http_server  # noqa: E402
from pymongo import monitoring  # noqa: E402

from bench.gce_sweep import fleet_arguments, start_emulator  # noqa: E402
from bench.k8s_sweep import start_world  # noqa: E402
from reaper.gce.inventory import PAGE_SIZE as GCE_PAGE  # noqa: E402
from reaper.k8s.inventory import PAGE_SIZE as K8S_PAGE  # noqa: E402
from reaper.ledger import Ledger  # noqa: E402
from reaper.model import Evidence, Plan  # noqa: E402
from reaper.sweep_lease import SweepLease  # noqa: E402
from tests.integration.prometheus import Prometheus  # noqa: E402

# Every public method of the ledger and of its sweep lease (same database, same round trips as before the split).
LEDGER_METHODS: list[tuple[str, str | None, str]] = [
    (module, cls.__name__, name)
    for module, cls in (("reaper.ledger", Ledger), ("reaper.sweep_lease", SweepLease))
    for name, member in vars(cls).items()
    if not name.startswith("_") and inspect.isfunction(member)
]
LEDGER_CALLS = [name for _, _, name in LEDGER_METHODS]
STEPS: dict[str, list[tuple[str, str | None, str]]] = {
    "listing": [("reaper.sweep.targets", "GceTarget", "list"), ("reaper.sweep.targets", "K8sTarget", "list")],
    "evidence": [("reaper.sweep.targets", "GceTarget", "evidence"), ("reaper.sweep.targets", "K8sTarget", "evidence")],
    "policy": [("reaper.policy", None, "evaluate")],
    "deletion": [("reaper.sweep.targets", "GceTarget", "delete"), ("reaper.sweep.targets", "K8sTarget", "delete")],
    # Every public Ledger and SweepLease method: the decisions, the resources' stories (first sweep: one
    # transition per resource), the approvals, the notices, the lease; none of them calls another.
    "ledger": LEDGER_METHODS,
}


def _rss(field: str) -> int:
    """``VmHWM`` (peak) or ``VmRSS`` of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


class Meter:
    """Wraps the reaper's own calls: time per step, peak RSS per step (the kernel's peak is reset before each)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        # Calls made while another step runs (the ledger writes of the delete threads): already in
        # that step's wall time, and summed over threads, so reported apart and never added twice.
        self.nested: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.peak: dict[str, int] = defaultdict(int)
        self.growth: dict[str, int] = defaultdict(int)  # peak above the RSS the step started with
        self.by_call: defaultdict[str, float] = defaultdict(
            float
        )  # seconds of each wrapped call outside another step's
        self._running: Counter[str] = Counter()
        self._lock = threading.Lock()
        for step, places in STEPS.items():
            for module, owner, name in places:
                self._wrap(step, module, owner, name)

    def _wrap(self, step: str, module: str, owner: str | None, name: str) -> None:
        import importlib

        holder = importlib.import_module(module)
        if owner:
            holder = getattr(holder, owner)
        original = getattr(holder, name)

        def timed(*args, **kwargs):
            with self._lock:
                outer = next((s for s, n in self._running.items() if n and s != step), None)
                self._running[step] += 1
            if outer:
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    with self._lock:
                        self._running[step] -= 1
                        self.nested[outer, step] += time.perf_counter() - started
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            rss, started = _rss("VmRSS"), time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self._running[step] -= 1
                    self.seconds[step] += time.perf_counter() - started
                    self.by_call[name] += time.perf_counter() - started
                peak = _rss("VmHWM")
                self.peak[step] = max(self.peak[step], peak)
                self.growth[step] = max(self.growth[step], peak - rss)

        setattr(holder, name, timed)

    def take(self) -> Meter:
        """This sweep's figures; the meter starts again from zero."""
        taken = Meter.__new__(Meter)
        taken.seconds, taken.nested, taken.peak, taken.growth = self.seconds, self.nested, self.peak, self.growth
        taken.by_call = self.by_call
        self.seconds, self.nested, self.peak, self.growth = (
            defaultdict(float),
            defaultdict(float),
            defaultdict(int),
            defaultdict(int),
        )
        self.by_call = defaultdict(float)
        return taken


class WarmStates:
    """The DAG's states of an earlier sweep of the same fleet, written just before the measured sweep records its
    transitions: what every sweep but a DAG's first finds. Without them the sweep records every resource as first
    seen (100,000 inserts, about 90 s in SecantusDB against about a second in MongoDB: bench/audit.py), and that
    one-time cost would be read as the sweep's. The earlier sweep kept everything the measured one plans to delete
    (they went stale since); the rest it saw as now. Its time is not the sweep's: it is taken off the wall time.
    ``--first-sweep`` measures a DAG's first sweep instead."""

    def __init__(self) -> None:
        self.seconds = 0.0
        original = Ledger.record_transitions

        def warmed(ledger: Ledger, ids: dict[str, object], plan: Plan, evidence: Evidence, run_label: str) -> int:
            started = time.perf_counter()
            self.write(ledger, str(ids["dag_id"]), plan, run_label)
            self.seconds += time.perf_counter() - started
            return original(ledger, ids, plan, evidence, run_label)

        Ledger.record_transitions = warmed  # type: ignore[method-assign, assignment]  # a wrapper outside the meter

    @staticmethod
    def write(ledger: Ledger, dag_id: str, plan: Plan, run_label: str) -> None:
        from reaper.model import Action
        from reaper.transitions import Seen, seen, split

        now = datetime.now(UTC)
        docs = []
        for key, entries in seen(plan, run_label).items():
            earlier = {
                uid: Seen("keep:warm_up", *s[1:]) if d is not None and d.action is Action.DELETE else s
                for uid, (s, d) in entries.items()
            }
            docs += [{**d._asdict(), "at": now} for d in split(dag_id, key, earlier)]
        ledger.states.insert_many(docs)

    def take(self) -> float:
        taken, self.seconds = self.seconds, 0.0
        return taken


class MongoCommands(monitoring.CommandListener):
    """Every command any MongoClient of this process sends, by name: the store and ledger round trips."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.counts[event.command_name] += 1

    def succeeded(self, event: object) -> None:
        pass

    def failed(self, event: object) -> None:
        pass


def writers(projects: list[str]) -> int:
    """One healthy manager per project, exported for Prometheus; returns the exporter's port."""
    registry = CollectorRegistry()
    gauge = Gauge("runner_manager_heartbeat_last_pass_timestamp_seconds", "", ["manager", "project"], registry=registry)
    failed = Gauge("runner_manager_heartbeat_failed_passes_total", "", ["manager", "project"], registry=registry)

    def beat() -> None:
        while True:
            for p in projects:
                gauge.labels(f"mgr-{p}", p).set(time.time())
                failed.labels(f"mgr-{p}", p).set(0)
            time.sleep(1)

    threading.Thread(target=beat, daemon=True).start()
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    return server.server_port


def configure(work: Path, mongo_port: int, config: dict[str, object]) -> None:
    path = work / "reaper.yaml"
    path.write_text(json.dumps(config))
    os.environ["REAPER_CONFIG"] = str(path)
    os.environ["AIRFLOW_CONN_MONGO_DEFAULT"] = json.dumps(
        {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_port}
    )


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used, from ``/proc/<pid>/stat`` (fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU seconds of this process and the servers it talks to, over one sweep: what a 2-core machine spent."""

    def __init__(self, servers: dict[str, int]) -> None:
        self.pids = {"reaper (this process: Airflow, the SDKs, the delete threads)": os.getpid(), **servers}
        self.start = self.now()

    def now(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def take(self) -> str:
        now, start = self.now(), self.start
        self.start = now
        return "CPU seconds: " + ", ".join(f"{name} {now[name] - start[name]:.1f}" for name in now)


def run(dag_id: str, meter: Meter, mongo: MongoCommands, warm: WarmStates | None) -> tuple[float, DagRun, float]:
    """The DAG's sweep under ``dag.test()``: its wall time (the warm-up's writes taken off), its run, and the
    warm-up's seconds (inside its ``evaluate_policy`` task)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    meter.take()
    mongo.counts.clear()
    started = time.perf_counter()
    dag_run = cast("DagRun", bag.dags[dag_id].test())
    warm_up = warm.take() if warm else 0.0
    return time.perf_counter() - started - warm_up, dag_run, warm_up


def start_execution_api() -> float:
    """Start ``dag.test()``'s in-process Execution API, which Airflow builds once a process (FastAPI routes and
    schemas, its DAG bag) on the first task's start; its seconds. A deployment's API server is up before any sweep:
    started here, before the clock, the first sweep's Airflow share is what a sweep pays, not the process's."""
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    began = time.perf_counter()
    api = in_process_api_server()  # cached: the tasks' supervisor takes this one
    assert api.app is not None and api.transport is not None  # both built on first use
    return time.perf_counter() - began


def task_seconds(dag_run: DagRun) -> tuple[float, Counter[str], defaultdict[str, float]]:
    """The summed duration of the run's task instances as Airflow recorded them, their number by task, and
    their seconds by task."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        took: defaultdict[str, float] = defaultdict(float)
        for ti in tis:
            if ti.end_date and ti.start_date:
                took[ti.task_id] += (ti.end_date - ti.start_date).total_seconds()
        return sum(took.values()), Counter(ti.task_id for ti in tis), took


def ledger_calls(meter: Meter, most: int = 6) -> str:
    """The ledger calls made outside another step (the deletes' are nested in theirs), slowest first."""
    calls = sorted(((n, s) for n, s in meter.by_call.items() if n in LEDGER_CALLS), key=lambda call: -call[1])
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in calls[:most])


def per_delete(commands: Counter[str] | dict[str, int], fixed: int, deletes: int) -> float:
    """The find and update commands beyond the fixed ones, per delete."""
    return (commands.get("find", 0) + commands.get("update", 0) - fixed) / max(deletes, 1)


def io_floor(pages: int, reaped: int, latency: float, wall: float, meter: Meter) -> str:
    """The GCE sweep's I/O floor (bench/gce_sweep.py's: the pages at the list concurrency, then one get, one
    delete and one operation wait per delete at the delete concurrency) against the sweep's wall time, with and
    without Airflow's share (the rest: task start-up, scheduling, XCom; a fixed cost, not the sweep's I/O)."""
    from reaper.config import parse_settings

    gce = parse_settings({}, "bench").gce
    floor = pages * latency / gce.list_concurrency + 3 * reaped * latency / gce.delete_concurrency
    steps = sum(meter.seconds.values())
    return (
        f"I/O floor {floor:.2f} s: wall {wall / floor:.2f}x it; the reaper's steps alone "
        f"({steps:.2f} s, Airflow's share left out) {steps / floor:.2f}x"
    )


def report(
    title: str,
    wall: float,
    meter: Meter,
    dag_run: DagRun,
    calls: list[tuple[str, int, int]],
    notes: list[str],
    warm_up: float,
) -> None:
    """The steps' times and the calls made against their lower bounds (a row named "at most" is a bound from
    above: flagged only when exceeded)."""
    print(f"\n## {title}")
    measured = sum(meter.seconds.values())
    for step in STEPS:
        print(f"  {step:10s} {meter.seconds[step]:7.2f} s  {100 * meter.seconds[step] / wall:5.1f} %")
        for (outer, inner), seconds in sorted(meter.nested.items()):
            if outer == step:
                print(f"    of which {inner} calls: {seconds:.2f} s, summed over the step's threads")
        if step == "ledger":
            print(f"    its calls: {ledger_calls(meter)}")
    rest = wall - measured
    in_tasks, tasks, took = task_seconds(dag_run)
    in_tasks -= warm_up
    took["evaluate_policy"] -= warm_up
    if warm_up:
        print(f"  (WarmStates: the earlier sweep's states written in {warm_up:.2f} s in evaluate_policy, not counted)")
    mapped = ", ".join(f"{n} {task}" for task, n in tasks.items() if n > 1)
    print(f"  {'Airflow':10s} {rest:7.2f} s  {100 * rest / wall:5.1f} %  (target < 20 %)")
    print(f"    between tasks (scheduling loop, task state in the DB): {wall - in_tasks:.2f} s")
    print(
        f"    in {tasks.total()} task instances ({mapped or 'none mapped more than once'}), "
        f"outside the steps (runner, XCom, files): {in_tasks - measured:.2f} s"
    )
    print("    task instances, start to end: " + ", ".join(f"{task} {seconds:.2f} s" for task, seconds in took.items()))
    print(f"  {'total':10s} {wall:7.2f} s")
    print(f"  {'calls':24s} {'made':>8s} {'lower bound':>12s}")
    for name, made, bound in calls:
        within = made <= bound if name.endswith("at most") else made == bound
        print(f"  {name:24s} {made:8d} {bound:12d}{'' if within else '  <-'}")
    heaviest = max(meter.growth, key=lambda s: meter.growth[s])
    print(
        f"  heaviest step: {heaviest}, peak RSS {meter.peak[heaviest] / 2**20:.0f} MiB "
        f"(+{meter.growth[heaviest] / 2**20:.0f} MiB during the step; the rest is Airflow and the SDKs, loaded once)"
    )
    for note in notes:
        print(f"  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fleet_arguments(parser)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--k8s-orphaned", type=float, default=0.05)
    parser.add_argument("--k8s-latency", type=float, default=0.010)
    parser.add_argument("--executor", choices=["dag-test", "celery"], default="dag-test")
    parser.add_argument("--gce-only", action="store_true", help="sweep the GCE fleet only")
    parser.add_argument("--commit-interval", default="0.01s", help="ledger.commit_interval (default: the config's)")
    parser.add_argument(
        "--first-sweep", action="store_true", help="each DAG's first sweep: every resource first seen (WarmStates)"
    )
    parser.add_argument("--workers", type=int, default=2, help="Celery workers (with --executor celery)")
    args = parser.parse_args()
    if args.executor == "celery":
        from bench.celery_sweep import main as celery_main

        celery_main(args, HOME, writers)
        return

    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    api_start = start_execution_api()
    mongo = MongoCommands()
    monitoring.register(mongo)
    meter = Meter()
    warm = None if args.first_sweep else WarmStates()
    work = HOME / "sweeps"
    work.mkdir()
    runs = [f"run-{r:06d}" for r in range(args.runs)]
    orphans = set(runs[:: round(1 / args.k8s_orphaned)])
    world = start_world(runs, orphans, args.k8s_latency)
    emulator, endpoint = start_emulator(args)
    projects = [f"ci-project-{p:03d}" for p in range(args.projects)]
    prom_dir = HOME / "prometheus"
    prom_dir.mkdir()
    prometheus = Prometheus(prom_dir, [f"127.0.0.1:{writers(projects)}"])
    try:
        os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"api_endpoint": endpoint, "anonymous": True}}
        )
        os.environ["AIRFLOW_CONN_BENCH_CLUSTER"] = json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(world.kubeconfig())}}
        )
        os.environ["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps(
            {"conn_type": "generic", "host": "127.0.0.1", "port": world.nats_port}
        )
        prometheus.wait_for_writers(len(projects))
        configure(
            work,
            world.mongo_port,
            {
                "gce": {"projects": projects, "writer_health": {"prometheus_url": prometheus.url}},
                "k8s": {"clusters": ["bench_cluster"], "delete_rate_per_cluster": 1000.0},
                "max_deletions_per_sweep": 100_000,
                "rollout": {"gce": "enforcement", "k8s": "enforcement"},  # the swept phase is the active one
                # The Kubernetes default schedule (1 min) leaves deletes about 34 s after the run starts;
                # at 80,000 objects SecantusDB's run-store lookups alone take ~30 s, and every delete
                # past the deadline is left for the next sweep. A fleet this size gets a longer run.
                # dag.test() runs every task in this one process, one after another: one worker, so one
                # listing shard (airflow.shards follows the workers that can list side by side; eight here
                # would be eight task starts in series, the same listing inside them).
                "airflow": {"sweep_store": f"file://{work}", "retries": 0, "run_timeout": "10m", "shards": 1},
                # SecantusDB (Python) takes seconds to write 80,000 decisions in one bulk write, more on a busy
                # machine; MongoDB takes well under one. The default 10 s would time the benchmark out, not the reaper.
                "ledger": {"timeout": "60s", "commit_interval": args.commit_interval},
            },
        )

        cpu = Cpu(
            {"GCE emulator": emulator.pid, "SecantusDB": world.procs[1].pid, "Kubernetes emulator": world.procs[0].pid}
        )
        gce_wall, gce_run, gce_warm = run("reaper_gce_enforcement", meter, mongo, warm)
        gce_cpu = cpu.take()
        gce_calls = requests.get(f"{endpoint}/_emulator/stats", timeout=10).json()["counters"]
        gce_meter, gce_mongo = meter.take(), dict(mongo.counts)

        if args.gce_only:
            k8s_run = None
        else:
            nats_before = world.nats_messages()
            k8s_wall, k8s_run, k8s_warm = run("reaper_k8s_enforcement", meter, mongo, warm)
            k8s_cpu = cpu.take()
            k8s_calls = world.api_calls()
            nats_msgs = world.nats_messages() - nats_before
            k8s_meter, k8s_mongo = meter.take(), dict(mongo.counts)
    finally:
        prometheus.stop()
        emulator.terminate()
        world.stop()

    def batches(dag_run: DagRun) -> int:
        """How many delete tasks ran (the batches ``cut_batches`` made): each reads its outcomes and intents once."""
        return task_seconds(dag_run)[1]["delete"]

    reaped = gce_calls.get("delete", 0)
    gce_batches = batches(gce_run)
    # Ledger: 1 decisions write, 2 finds for an earlier execution and 1 for this one's outcomes so far;
    # per delete batch: 1 outcomes find and 1 intents find; then record's outcomes find and summary; the
    # lease (find_one_and_update, delete); createIndexes. Per delete, one at a time, 1 lease check and 3
    # writes (the intent, marked sent, the outcome); in group commits (reaper.commits) at most one round
    # trip per delete on average, the target.
    fixed = 1 + 1 + 3 + 2 * gce_batches + 1
    one_at_a_time = fixed + 4 * reaped
    gce_pages = args.projects * math.ceil(args.per_project / GCE_PAGE)
    k8s_state = k8s_run.state if k8s_run else "not run"
    print(f"# dag.test() sweeps; state {gce_run.state} (GCE), {k8s_state} (Kubernetes)")
    print(f"# dag.test()'s in-process Execution API started before the sweeps, in {api_start:.2f} s (not counted)")
    report(
        f"reaper_gce_enforcement: {args.projects * args.per_project:,} instances, {args.projects} projects, "
        f"{args.latency * 1000:.0f} ms latency",
        gce_wall,
        gce_meter,
        gce_run,
        [
            ("aggregated_list", gce_calls.get("aggregated_list", 0), gce_pages),
            ("get", gce_calls.get("get", 0), reaped),
            ("delete", reaped, reaped),
            ("operation_wait", gce_calls.get("operation_wait", 0), reaped),
            ("ledger round trips, at most", gce_mongo.get("update", 0) + gce_mongo.get("find", 0), fixed + reaped),
            ("getMore commands", gce_mongo.get("getMore", 0), 0),
        ],
        [
            f"Mongo commands: {gce_mongo}",
            f"ledger round trips of the deletes: {per_delete(gce_mongo, fixed, reaped):.2f} per delete "
            f"(one at a time: 4, {one_at_a_time:,} in all)",
            f"deleted {reaped:,}; interval 10 min: {gce_wall / 600:.0%} of it",
            io_floor(gce_pages, reaped, args.latency, gce_wall, gce_meter),
            f"{gce_cpu} (the machine: {os.cpu_count()} cores x {gce_wall:.1f} s)",
        ],
        gce_warm,
    )
    if k8s_run is None:
        return
    k8s_deleted = k8s_calls.get("delete", 0)
    k8s_batches = batches(k8s_run)
    reaped_runs = len(orphans)
    per_kind = {"Pod": args.runs, "Secret": 2 * args.runs, "NetworkPolicy": args.runs}
    # Per reaped run: its 4 objects read again before the Pod, the Pod read at least once after its
    # delete, the other 3 read again and its Pods listed once it is gone; its evidence read twice
    # (NATS: one key; the run store: one find). Ledger as for GCE, per object deleted. The run store
    # proves it is the configured one once per task that reads it: the evidence task and each delete task.
    proofs = 1 + k8s_batches
    k8s_store = math.ceil(args.runs / 1000) + proofs + 2 * reaped_runs  # the run store's finds
    k8s_fixed = k8s_store + 3 + 2 * k8s_batches + 1 + 2 + k8s_deleted  # the ledger's, at most one per delete
    report(
        f"reaper_k8s_enforcement: {args.runs:,} runs ({4 * args.runs:,} objects), {args.k8s_latency * 1000:.0f} ms",
        k8s_wall,
        k8s_meter,
        k8s_run,
        [
            ("list", k8s_calls.get("list", 0), sum(math.ceil(n / K8S_PAGE) for n in per_kind.values()) + reaped_runs),
            ("list by name", k8s_calls.get("list_named", 0), 8 * reaped_runs),
            ("delete", k8s_deleted, 4 * reaped_runs),
            ("run store + ledger, at most", k8s_mongo.get("find", 0) + k8s_mongo.get("update", 0), k8s_fixed),
            ("getMore commands", k8s_mongo.get("getMore", 0), 0),
        ],
        [
            f"Mongo commands: {k8s_mongo}",
            f"ledger round trips of the deletes: {per_delete(k8s_mongo, k8s_fixed - k8s_deleted, k8s_deleted):.2f} "
            f"per delete (one at a time: 4)",
            f"NATS client messages: {nats_msgs} (the lease listing; each reaped run's lease read again twice)",
            f"{k8s_cpu} (the machine: {os.cpu_count()} cores x {k8s_wall:.1f} s)",
        ],
        k8s_warm,
    )


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(HOME, ignore_errors=True)  # Airflow's home: its DB, the sweep files
