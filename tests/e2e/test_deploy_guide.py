"""The deployment guide's "Trying a deployment against the emulators" (docs/deploy.md), followed literally:
its own ``sh`` blocks (those after ``<!-- guide: emulators -->``, in order, in one bash), on a fresh
``AIRFLOW_HOME`` and a fresh PostgreSQL database, with no variable of the test's own Airflow, up to one
report-only sweep per target; then its ``<!-- guide: stop -->`` block.

Only the placeholders the guide itself reads as ``${NAME:-default}`` are set: every ``*_PORT`` to a free
port, ``TRIAL`` to a temporary directory, ``TRIAL_DB`` to a database name of this test's own, ``PG_URL`` to
the local PostgreSQL server as the tests reach it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from include.emulators.http import free_port
from tests.helpers import POSTGRES_DSN, ROOT

GUIDE = ROOT / "docs" / "deploy.md"
GUIDE_BLOCK = re.compile(r"^<!-- guide: (\w+) -->\n```sh\n(.*?)^```$", re.S | re.M)
PLACEHOLDER = re.compile(r"\$\{(\w+):-")
SWEEPS = ("reaper_gce_report_only", "reaper_k8s_report_only")


def guide(kind: str) -> str:
    """The guide's blocks of ``kind``, in order, as one script."""
    blocks = [body for k, body in GUIDE_BLOCK.findall(GUIDE.read_text()) if k == kind]
    assert blocks, f"{GUIDE.relative_to(ROOT)} has no <!-- guide: {kind} --> block"
    return "\n".join(blocks)


def placeholders(script: str, trial: Path) -> dict[str, str]:
    """A value for each ``${NAME:-default}`` of the guide: the test picks ports and places, nothing else."""
    values = {}
    for name in sorted(set(PLACEHOLDER.findall(script))):
        if name.endswith("_PORT"):
            values[name] = str(free_port())
        elif name == "TRIAL":
            values[name] = str(trial)
        elif name == "TRIAL_DB":
            values[name] = f"reaper_guide_{uuid.uuid4().hex[:8]}"
        elif name == "PG_URL":
            values[name] = POSTGRES_DSN.rsplit("/", 1)[0]  # the local server, as the tests reach it
        else:
            raise AssertionError(f"the guide reads ${{{name}}}, which this test does not know how to set")
    return values


def tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


@pytest.mark.slow(70)
def test_the_deployment_guide_sweeps_each_target_report_only(tmp_path: Path) -> None:
    script = guide("emulators")
    trial = tmp_path / "trial"
    values = placeholders(script, trial)
    # A new user's shell: none of the test's own Airflow settings (conftest's AIRFLOW_HOME, unit-test mode).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "REAPER"))} | values
    log = tmp_path / "guide.log"
    with log.open("wb") as out:
        bash = subprocess.Popen(
            ["bash", "-c", f"set -ex\nPS4='+ $SECONDS s: '\n{script}"],  # each command traced, with the time
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # what it starts in the background stays in its process group
        )
    try:
        try:
            code = bash.wait(timeout=240)
        except subprocess.TimeoutExpired:
            code = None
        logs = "\n".join(
            f"--- {p.name}\n{tail(p, 30)}" for p in sorted((trial / "logs").glob("*.log"))
        )  # the managers' too
        assert code == 0, f"the guide exited {code}:\n{tail(log)}\n{logs}"

        with psycopg.connect(database_dsn(values["TRIAL_DB"])) as db:
            states: dict[str, str] = dict(db.execute("SELECT dag_id, state FROM dag_run").fetchall())
        assert states == dict.fromkeys(SWEEPS, "success")

        # The preflight it ran before sweeping: every check passed (its summary line is the last it prints).
        checks = [line for line in log.read_text().splitlines() if line.startswith(("ok   ", "FAIL "))]
        assert checks and all(line.startswith("ok   ") for line in checks), checks
        assert " ok, 0 failed" in log.read_text()
        # What the guide's own look at the audit view's JSON printed: one summary per sweep.
        sweeps = {s["dag_id"]: s for s in map(json.loads, (trial / "sweeps.jsonl").read_text().splitlines())}
        assert set(sweeps) == set(SWEEPS)
        assert all(s["state"] == "success" and not s["outcomes"] for s in sweeps.values())
        assert decided(sweeps["reaper_gce_report_only"]) == {("report", "heartbeat_stale"): 40}
        assert decided(sweeps["reaper_k8s_report_only"]) == {
            ("report", "sandbox_orphan"): 40,  # 10 runs, 4 objects each
            ("report", "lease_absent_run_active"): 20,  # the 5 crashed runs
        }
        # ... and the emulators' request counters it printed: not one delete call reached either.
        gce, k8s = (json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"counters"'))
        assert "delete" not in gce["counters"] and "delete" not in k8s["counters"] and k8s["deletes"] == 0
        assert gce["counters"]["aggregated_list"] >= 3 and k8s["counters"]["list"] >= 3  # each project, kind listed
    finally:
        left = stop(bash, env, tmp_path)
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{values["TRIAL_DB"]}" WITH (FORCE)')
    assert not left, f"the guide's stop block left these running:\n{left}\n{tail(tmp_path / 'stop.log')}"


def decided(summary: dict[str, Any]) -> dict[tuple[str, str], int]:
    """A sweep summary's decisions that are not keep, counted by (action, reason)."""
    counts: dict[tuple[str, str], int] = {}
    for d in summary["decisions"]:
        if d["action"] != "keep":
            counts[d["action"], d["reason"]] = counts.get((d["action"], d["reason"]), 0) + d["count"]
    return counts


def database_dsn(name: str) -> str:
    return POSTGRES_DSN.rsplit("/", 1)[0] + f"/{name}"


def stop(bash: subprocess.Popen, env: dict[str, str], tmp_path: Path) -> str:
    """The guide's own stop block; then whatever of the guide's process group it left is killed, and
    returned (``ps`` lines; empty when the block stopped everything)."""
    with (tmp_path / "stop.log").open("wb") as out:
        subprocess.run(["bash", "-c", guide("stop")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    ps = ["ps", "-o", "pid=,stat=,args=", "--sid", str(bash.pid)]
    left = "\n".join(
        line for line in subprocess.run(ps, capture_output=True, text=True).stdout.splitlines() if " Z" not in line
    )
    with contextlib.suppress(ProcessLookupError):
        os.killpg(bash.pid, signal.SIGKILL)
    bash.wait(timeout=10)
    return left
