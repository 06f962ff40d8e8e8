"""The audit view once in a real browser: headless Chromium against ``airflow standalone`` after a sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from include.emulators.http import free_port, wait_until
from tests.helpers import ROOT
from tests.helpers.gce import add_instance

PASSWORD = "reaper-browser-test"


def _standalone(tmp_path: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    home = tmp_path / "standalone-home"
    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
    env = {
        **env,
        # standalone starts its components as `airflow ...` subprocesses: the venv's bin must be on PATH.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
    }
    log = (tmp_path / "standalone.log").open("wb")
    airflow = str(Path(sys.executable).parent / "airflow")
    return subprocess.Popen([airflow, "standalone"], env=env, stdout=log, stderr=log, start_new_session=True)


def test_audit_page_in_chromium_shows_the_sweeps_deletions(gce, sweeper, tmp_path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    fleet, clients = gce
    add_instance(fleet, "p1", "us-east1-b", "browser-terminated-vm", status="TERMINATED")
    add_instance(fleet, "p1", "us-east1-b", "browser-fresh-vm")
    sweeper.connect_gce(clients.instances._transport._host)
    sweeper.configure({"gce": {"projects": ["p1"], "writer_health": {"source": "none"}}, "k8s": {"enabled": False}})
    run = sweeper.run("reaper_gce_enforcement")
    assert run.state == "success" and fleet.names("p1") == {"browser-fresh-vm"}

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = _standalone(tmp_path, dict(os.environ), port)
    driver = None
    try:
        health = f"{base}/api/v2/monitor/health"
        wait_until(lambda: requests.get(health, timeout=2).ok, f"airflow standalone ({tmp_path})", 240, process)
        token = requests.post(f"{base}/auth/token", json={"username": "admin", "password": PASSWORD}, timeout=10)
        token.raise_for_status()
        options = Options()
        options.binary_location = "/usr/bin/chromium"
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--window-size=1400,900",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.set_page_load_timeout(30)
        driver.get(f"{base}/reaper/")
        assert "Not authenticated" in driver.page_source  # no session yet: refused
        driver.add_cookie({"name": "_token", "value": token.json()["access_token"], "path": "/"})
        driver.get(f"{base}/reaper/?dag_id=reaper_gce_enforcement&run_id={requests.utils.quote(run.run_id)}")
        page = driver.page_source
        driver.save_screenshot(str(tmp_path / "reaper-audit.png"))
        assert "Reaper sweeps" in page and run.run_id in page
        assert "browser-terminated-vm" in page and "deleted" in page and "terminated" in page
        assert "browser-fresh-vm" not in page
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _need_a_browser() -> None:
    for tool in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        if not Path(tool).exists():
            raise RuntimeError(f"{tool} is missing: run scripts/bootstrap.sh (make test does)")
