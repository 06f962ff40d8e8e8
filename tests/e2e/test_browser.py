"""The audit view in a real browser: headless Chromium against Airflow's API server after two real sweeps.

One API server (``airflow api-server``, on the metadata DB the sweeps ran in, so the links into
Airflow's UI find their DAG runs) with two users: ``admin``, and ``restricted``, who may read the
report-only DAG only (:mod:`tests.e2e.restricted_auth`). Screenshots of every page go to
``var/test-artifacts/audit-view/`` (``REAPER_TEST_ARTIFACTS`` overrides it).
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import pytest
import requests

from include.emulators.http import free_port, wait_until
from tests.helpers import ROOT
from tests.helpers.gce import add_instance

pytestmark = pytest.mark.slow(50)  # seconds, about: the heaviest modules start first (tests/conftest.py)

PASSWORD = "reaper-browser-test"
REPORT_ONLY, ENFORCEMENT = "reaper_gce_report_only", "reaper_gce_enforcement"
ARTIFACTS = Path(os.environ.get("REAPER_TEST_ARTIFACTS", ROOT / "var" / "test-artifacts" / "audit-view"))


class Server:
    """Airflow's API server with the reaper plugin, on a free port, and a session token per user."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        passwords = tmp_path / "passwords.json"
        passwords.write_text(json.dumps({"admin": PASSWORD, "restricted": PASSWORD}))
        env = {
            **os.environ,  # the test's AIRFLOW_HOME (its metadata DB), REAPER_CONFIG and connections
            "PYTHONPATH": str(ROOT),
            "AIRFLOW__CORE__AUTH_MANAGER": "tests.e2e.restricted_auth.SomeDagsAuthManager",
            "REAPER_TEST_READABLE_DAGS": f"restricted={REPORT_ONLY}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,restricted:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        }
        self.log = tmp_path / "api-server.log"
        airflow = str(Path(sys.executable).parent / "airflow")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [airflow, "api-server", "-H", "127.0.0.1", "-p", str(self.port), "-w", "1"],
                env=env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        health = f"{self.base}/api/v2/monitor/health"
        wait_until(lambda: requests.get(health, timeout=2).ok, f"airflow api-server ({self.log})", 120, self.process)

    def token(self, user: str) -> str:
        answer = requests.post(f"{self.base}/auth/token", json={"username": user, "password": PASSWORD}, timeout=10)
        answer.raise_for_status()
        return str(answer.json()["access_token"])

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


@pytest.fixture
def chromium(tmp_path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    for tool in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        if not Path(tool).exists():
            raise RuntimeError(f"{tool} is missing: run scripts/bootstrap.sh (make test does)")
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
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


DECISIONS = "Reaper decisions"  # the DAG-run tab (plugins/reaper_audit.py)


def _in_airflow(driver, path: str, page: str, text: str) -> None:
    """Airflow's own page at ``path`` shows the audit view's ``page`` in an iframe, and that page holds ``text``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    frame = WebDriverWait(driver, 30).until(lambda d: d.find_element(By.TAG_NAME, "iframe"))
    assert unquote(urlparse(driver.current_url).path).startswith(path)  # a nav page may append the view's path
    assert unquote(urlparse(frame.get_attribute("src")).path) == unquote(urlparse(page).path)
    driver.switch_to.frame(frame)
    try:
        WebDriverWait(driver, 30).until(lambda d: text in d.page_source)
    finally:
        driver.switch_to.default_content()


def _shot(driver, name: str) -> None:
    """A full-page screenshot in the artifacts folder."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(height + 200, 600), 4000))  # the window, not the page: room for its frame
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    driver.set_window_size(1400, 1000)


def _columns(driver, chart: str) -> list[dict[str, int]]:
    """The counts of every column of the charts whose title starts with ``chart``, in page order."""
    from selenium.webdriver.common.by import By

    found = []
    for figure in driver.find_elements(By.CSS_SELECTOR, "figure.chart"):
        if figure.find_element(By.TAG_NAME, "figcaption").text.startswith(chart):
            found += [json.loads(c.get_attribute("data-values")) for c in figure.find_elements(By.CSS_SELECTOR, ".col")]
    return found


def _names(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        row.find_elements(By.TAG_NAME, "td")[3].text
        for row in driver.find_elements(By.CSS_SELECTOR, "table.rows tbody tr")
    ]


def test_the_audit_view_after_two_sweeps(gce, sweeper, tmp_path, chromium) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    fleet, clients = gce
    for i in range(3):
        add_instance(fleet, "p1", "us-east1-b", f"fresh-{i}")
    # No writer-health source: every stale heartbeat is held (writer_health_unknown), the other rules act.
    add_instance(fleet, "p1", "us-east1-b", "browser-stale", heartbeat_age=86400)
    add_instance(fleet, "p1", "us-east1-c", "browser-terminated", status="TERMINATED")
    add_instance(fleet, "p1", "us-east1-c", "browser-unlabeled", heartbeat_age=None, created_age=4 * 86400)
    for i in range(3):  # most of p2 stale: its budget trips too
        add_instance(fleet, "p2", "us-east1-b", f"p2-stale-{i}", heartbeat_age=86400)
    add_instance(fleet, "p2", "us-east1-b", "p2-fresh")
    sweeper.connect_gce(clients.instances._transport._host)
    config = {
        "gce": {"projects": ["p1", "p2"], "writer_health": {"source": "none"}},
        "k8s": {"enabled": False},
        # A ledger of its own: the overview shows every sweep its ledger holds, and the other tests of this
        # pytest worker (one SecantusDB each) write theirs to the default database.
        "ledger": {"database": f"reaper_browser_{uuid.uuid4().hex[:8]}"},
    }
    # The rollout moves from report-only to enforcement between the two sweeps, each of its active phase.
    sweeper.configure({**config, "rollout": {"gce": "report-only"}})
    first = sweeper.run(REPORT_ONLY)  # deletes the TERMINATED VM, reports the stale and the unlabeled ones
    sweeper.configure({**config, "rollout": {"gce": "enforcement"}})
    second = sweeper.run(ENFORCEMENT)  # deletes the unlabeled VM; the stale ones stay held
    assert (first.state, second.state) == ("success", "success")
    assert fleet.names("p1") == {"fresh-0", "fresh-1", "fresh-2", "browser-stale"}

    server = Server(tmp_path)
    driver = chromium
    try:
        base = server.base
        # Anonymous: every kind of route refused before any data is read.
        # A browser is sent to Airflow's login page, which will bring it back; a script gets the 401.
        driver.get(f"{base}/reaper/")
        assert "/auth/login" in driver.current_url and quote(f"{base}/reaper/", safe="") in driver.current_url
        assert "Not authenticated" not in driver.page_source
        for path in ("/reaper/api/sweeps", f"/reaper/sweeps/{ENFORCEMENT}/{quote(second.run_id, safe='')}/rows.csv"):
            assert requests.get(base + path, timeout=10).status_code == 401, path

        driver.add_cookie({"name": "_token", "value": server.token("admin"), "path": "/"})
        driver.get(f"{base}/reaper/")
        _shot(driver, "overview")
        page = driver.page_source
        # The first screen: what needs a human now, with the runbook's one action, linked to its sweep.
        needs = driver.find_elements(By.CSS_SELECTOR, "table.needs tbody tr")
        held = sorted(r.text for r in needs if r.text.startswith("scope held"))
        assert len(held) == 2, [r.text for r in needs]
        assert "scope p1" in held[0] and "deletes held: writer_health_unknown" in held[0]
        assert "writer-health series readable" in held[0] and "#reaperwriterhold" in held[0]
        # p2's budget hold too, but the first hold's action comes first: the writers' health (an override of the
        # budget would lift nothing while the writers' health holds the heartbeat deletes).
        assert "scope p2" in held[1] and "budget_exceeded" in held[1] and "#reaperwriterhold" in held[1]
        first_screen = driver.find_element(By.CSS_SELECTOR, "table.needs").rect
        assert first_screen["y"] + first_screen["height"] < 1000, first_screen  # above the fold
        # The active phase's fleet in a few charts (not one per scope); the report-only DAG one click away.
        assert _columns(driver, "deleted, by outcome") == [{"deleted": 1}]
        assert _columns(driver, "orphans found, by rule") == [{"heartbeat_stale": 4, "unlabeled_age": 1}]
        assert _columns(driver, "scopes held, by hold") == [{"writer_health_unknown": 2}]  # by its first hold
        assert _columns(driver, "census") == [] and REPORT_ONLY in page
        # Drill down to one scope.
        Select(driver.find_element(By.NAME, "scope")).select_by_value("p2")
        driver.find_element(By.XPATH, "//select[@name='scope']/ancestor::form//button").click()
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.XPATH, "//h3[text()='scope p2']"))
        assert _columns(driver, "census") == [{"RUNNING": 4}]
        assert _columns(driver, "reports by reason") == [{"writer_health_unknown": 3}]
        assert "hold budget_exceeded on p2 (blocks deletes), S 3 / L 4" in driver.page_source
        _shot(driver, "overview-scope")

        # The report-only DAG's fleet, and a chart's column opens its sweep.
        driver.find_element(By.LINK_TEXT, REPORT_ONLY).click()
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.XPATH, f"//h2[text()='GCE: {REPORT_ONLY}']"))
        assert _columns(driver, "deleted, by outcome") == [{"deleted": 1}]
        charts = [f for f in driver.find_elements(By.CSS_SELECTOR, "figure.chart") if "deleted" in f.text]
        charts[-1].find_element(By.CSS_SELECTOR, "a.col").click()  # report-only's only sweep
        assert unquote(urlparse(driver.current_url).path).endswith(f"/sweeps/{REPORT_ONLY}/{first.run_id}")
        assert "browser-terminated" in driver.page_source and "TERMINATED longer than the grace" in driver.page_source

        # The enforcement sweep: one row per resource, filters, pages, exports.
        sweep = f"{base}/reaper/sweeps/{ENFORCEMENT}/{quote(second.run_id, safe='')}"
        driver.get(f"{sweep}?order=name")
        _shot(driver, "sweep")
        assert _names(driver) == ["browser-stale", "browser-unlabeled", "p2-stale-0", "p2-stale-1", "p2-stale-2"]
        page = driver.find_element(By.TAG_NAME, "body").text
        assert (
            "heartbeat 1 d old, but the writers' health is unknown (unreadable, or no series for the project)" in page
            and "S 3 / L 4" in page
        )
        assert "no valid heartbeat label and older than the maximum age, of 3 d" in page and "deleted" in page
        # Filters offer the values the sweep has: choose scope p2 in its list.
        driver.get(f"{sweep}?order=-name&size=2")
        choices = [o.get_attribute("value") for o in Select(driver.find_element(By.NAME, "scope")).options]
        assert choices == ["", "p1", "p2"]
        Select(driver.find_element(By.NAME, "scope")).select_by_value("p2")
        driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
        WebDriverWait(driver, 30).until(lambda d: "scope=p2" in d.current_url and d.find_elements(By.ID, "total"))
        assert _names(driver) == ["p2-stale-2", "p2-stale-1"] and driver.find_element(By.ID, "total").text == "3"
        driver.find_element(By.CSS_SELECTOR, "a[rel=next]").click()
        assert _names(driver) == ["p2-stale-0"]
        _shot(driver, "sweep-filtered")
        export = driver.find_element(By.LINK_TEXT, "export CSV").get_attribute("href")
        cookies = {"_token": driver.get_cookie("_token")["value"]}
        rows = list(csv.DictReader(io.StringIO(requests.get(export, cookies=cookies, timeout=10).text)))
        assert sorted(r["name"] for r in rows) == ["p2-stale-0", "p2-stale-1", "p2-stale-2"]
        assert {r["reason"] for r in rows} == {"writer_health_unknown"}

        # Into Airflow: the DAG run of this sweep.
        driver.get(sweep)
        driver.find_element(By.LINK_TEXT, "DAG run").click()
        WebDriverWait(driver, 30).until(lambda d: second.run_id in d.find_element(By.TAG_NAME, "body").text)
        assert unquote(urlparse(driver.current_url).path) == f"/dags/{ENFORCEMENT}/runs/{second.run_id}"
        # And back: the run's own "Reaper decisions" tab shows this sweep's page inside Airflow.
        tab = WebDriverWait(driver, 30).until(lambda d: d.find_element(By.XPATH, f"//*[text()='{DECISIONS}']"))
        _shot(driver, "airflow-dag-run")
        tab.click()
        _in_airflow(
            driver, f"/dags/{ENFORCEMENT}/runs/{second.run_id}/plugin/reaper-decisions", sweep, "browser-unlabeled"
        )
        _shot(driver, "airflow-dag-run-decisions")
        # The Browse menu's entry shows the overview inside Airflow too.
        driver.get(f"{base}/plugin/reaper-sweeps")
        _in_airflow(driver, "/plugin/reaper-sweeps", f"{base}/reaper/", "Needs a human now")
        _shot(driver, "airflow-browse-sweeps")

        # A resource deleted two sweeps ago (sweep one of two), and one reported then deleted.
        driver.get(f"{base}/reaper/history?q=browser-terminated")
        assert "outcome deleted at" in driver.find_element(By.CSS_SELECTOR, ".story").text
        driver.get(f"{base}/reaper/history?q=browser-unlabeled")
        story = driver.find_element(By.CSS_SELECTOR, ".story").text
        assert story.startswith("reported in 1 sweep, delete intent at") and "outcome deleted" in story
        _shot(driver, "history")
        # A VM never deleted: its story is its transitions, found by the start of its name.
        driver.get(f"{base}/reaper/history?q=fresh-")
        resources = driver.find_elements(By.CSS_SELECTOR, "h2.resource")
        assert sorted(r.text.split()[1] for r in resources) == ["fresh-0", "fresh-1", "fresh-2"]
        told = driver.find_element(By.CSS_SELECTOR, "table.transitions").text
        assert "kept (fresh), first seen" in told and ENFORCEMENT in told
        _shot(driver, "history-kept")
        driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
        )
        driver.get(f"{base}/reaper/")
        _shot(driver, "overview-dark")

        # The restricted user: the report-only DAG only.
        restricted = server.token("restricted")
        driver.add_cookie({"name": "_token", "value": restricted, "path": "/"})
        driver.get(f"{base}/reaper/")
        _shot(driver, "overview-restricted")
        assert REPORT_ONLY in driver.page_source and ENFORCEMENT not in driver.page_source
        assert requests.get(sweep, cookies={"_token": restricted}, timeout=10).status_code == 403
        driver.get(f"{base}/reaper/history?q=browser-stale")
        assert second.run_id not in driver.page_source and first.run_id in driver.page_source
    finally:
        server.stop()
