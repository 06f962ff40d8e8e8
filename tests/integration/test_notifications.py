"""The owners' notices end to end: the sweep's real steps, a real ledger (SecantusDB), Airflow's ``SmtpNotifier``
through an Airflow connection, and a local SMTP server (aiosmtpd) that receives the mail, refuses it, is down, or
hangs. Whatever the mail server does, ``record`` ends as the sweep did and counts what it could not send."""

from __future__ import annotations

import builtins
import email
import html
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
from aiosmtpd.controller import Controller

from include.emulators.http import free_port
from reaper.config import LedgerConfig, Settings
from reaper.fence import SendGuard
from reaper.ledger import Ledger
from reaper.model import Evidence, GceInstance, Outcome, Phase, Resolved, Resource, ScopeListing, WriterRecord
from reaper.records import Notices, Sent
from reaper.retry import Stop
from reaper.sweep import notices, steps
from reaper.sweep.targets import GceTarget
from tests.builders import D, M, inst, settings

OWNERS = ["owners@example.com", "sre@example.com"]
CONN = "reaper_mail"
FAILING = "vm-p2-stuck"
LEAKY = "delete: 403 Forbidden: POST https://bob:hunter2@compute.example/v1/instances/1?key=K"


@dataclass
class Mailbox:
    """What the local SMTP server received; ``refuse`` makes it answer every recipient with a 550."""

    mails: list[tuple[str, list[str], Message]] = field(default_factory=list)
    refuse: bool = False

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.mails.append((envelope.mail_from, list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"

    def by_subject(self) -> dict[str, str]:
        """Subject -> the body as its reader sees it (the HTML part, unescaped)."""
        found = {}
        for _, _, message in self.mails:
            part = next(p for p in message.walk() if p.get_content_type() == "text/html")
            found[str(message["Subject"])] = html.unescape(part.get_payload(decode=True).decode())
        return found


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Mailbox]:
    """A local SMTP server, and the Airflow connection ``reaper_mail`` to it (plain SMTP, no retries)."""
    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=free_port())
    controller.start()
    connect(monkeypatch, controller.port)
    yield box
    controller.stop()


def connect(monkeypatch: pytest.MonkeyPatch, port: int, timeout: int = 3) -> None:
    extra = {"disable_ssl": True, "disable_tls": True, "timeout": timeout, "retry_limit": 0}
    conn = {"conn_type": "smtp", "host": "127.0.0.1", "port": port, "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps(conn))


@pytest.fixture
def ledger(mongo) -> Ledger:
    client, db = mongo
    return Ledger(client, LedgerConfig(database=db))


class Fleet(GceTarget):
    """Two projects listed from memory with healthy writers; deleting ``FAILING`` fails with an API error that
    quotes a URL with credentials, every other delete succeeds."""

    def __init__(self, config: Settings, fleet: list[GceInstance]) -> None:
        super().__init__(config)
        self.fleet = fleet

    def resolve(self, scopes: list[str], stop: Stop | None = None) -> list[Resolved]:
        return [Resolved(s, (s,)) for s in scopes]

    def list(self, scopes: list[str], stop: Stop | None = None) -> list[ScopeListing]:
        return [ScopeListing("gce", s, [i for i in self.fleet if i.project == s], 1) for s in scopes]

    def evidence(self, resources: builtins.list[Resource], incomplete: builtins.list[str]) -> Evidence:
        return Evidence(writer_health=[WriterRecord(f"mgr-{p}", p, time.time() - 60, False) for p in ("p1", "p2")])

    def delete(self, resources: builtins.list[GceInstance], guard: SendGuard) -> builtins.list[Outcome]:
        outcomes = []
        for r in resources:
            assert guard.before_send(r) is None and guard.ready(r) is None
            outcomes.append(Outcome(r, "failed", LEAKY) if r.name == FAILING else Outcome(r, "deleted"))
            guard.record(r, outcomes[-1].result, outcomes[-1].detail)
        return outcomes


class Execution(steps.Execution):
    def ledger(self) -> Ledger:
        return self._ledger  # type: ignore[attr-defined]  # set on the instance by the test


def fleet() -> list[GceInstance]:
    """p1: 3 of 4 heartbeats stale, its budget holds them; p2: 2 of 5 stale, one delete succeeds and one fails."""
    stale, fresh = str(int(time.time() - D)), str(int(time.time() - M))
    p1 = [inst(name=f"vm-p1-{i}", project="p1", hb=stale) for i in range(3)] + [inst(project="p1", hb=fresh)]
    p2 = [inst(name="vm-p2-gone", project="p2", hb=stale), inst(name=FAILING, project="p2", hb=stale)]
    return p1 + p2 + [inst(project="p2", hb=fresh) for _ in range(3)]


def sweep(
    tmp_path: Path,
    ledger: Ledger,
    run: str = "scheduled__1",
    events: list[str] | None = None,
    channels: list[dict[str, object]] | None = None,
    **notifications: object,
) -> Execution:
    """A sweep of ``fleet()`` whose one channel mails ``OWNERS`` through ``CONN`` (``events``: all by default),
    or with ``channels`` of its own."""
    mail = {"kind": "smtp", "conn_id": CONN, "to": OWNERS, "from_email": "reaper@example.com"}
    channels = channels or [{**mail, "events": events or ["held", "failed", "deleted"]}]
    config = settings(
        gce={"projects": ["p1", "p2"]},
        airflow={"sweep_store": f"file://{tmp_path}", "shards": 1, "lease_wait": "0s"},
        rollout={"gce": "enforcement"},
        notifications={"channels": channels, "digest_every": 0, "timeout": "5s", **notifications},
    )
    made = Execution(config, Fleet(config, fleet()), Phase.ENFORCEMENT, steps.Ids("reaper_gce_enforcement", run, 0))
    object.__setattr__(made, "_ledger", ledger)
    return made


def run(
    s: Execution, params: dict[str, object] | None = None
) -> tuple[steps.Planned, steps.Branch, list[steps.Deleted], steps.Lease]:
    """resolve_scopes -> list_inventory -> gather_evidence -> evaluate_policy -> budget_check -> delete, as the
    DAG runs them; ``record`` is the caller's."""
    params = params or {}
    setup = steps.resolve_scopes(s, params)
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    planned = steps.evaluate_policy(s, steps.gather_evidence(s, shards, setup.lease), params, "sre", setup.lease)
    branch = steps.budget_check(planned.summary)
    return planned, branch, [steps.delete(s, b, setup.lease, None) for b in planned.batches], setup.lease


def record(s: Execution, planned: steps.Planned, branch: steps.Branch, results, lease) -> dict[str, object]:
    started = datetime.now(UTC)
    done = steps.record(s, planned.summary, branch, len(planned.batches), results, lease, started)
    s.ledger().sweep_lease.release(s.target.name, s.ids.holder)
    return done


def notified(ledger: Ledger) -> Notices:
    (summary,) = ledger.summaries()
    assert isinstance(summary.notifications, Notices), summary.notifications
    return summary.notifications


def test_a_sweep_mails_its_held_scope_its_failed_delete_and_its_digest_once(
    tmp_path: Path, smtp: Mailbox, ledger
) -> None:
    s = sweep(tmp_path, ledger)
    planned, branch, results, lease = run(s)
    assert record(s, planned, branch, results, lease)["outcomes"] == {"deleted": 1, "failed": 1}
    assert [(sender, to) for sender, to, _ in smtp.mails] == [("reaper@example.com", OWNERS)] * 3
    mails = smtp.by_subject()
    assert set(mails) == {
        "[reaper] gce: deletes held in p1",
        "[reaper] gce: 1 delete failed in p2",
        "[reaper] gce: 1 resource deleted",
    }
    held = mails["[reaper] gce: deletes held in p1"]
    assert "p1: 3 deletes held this sweep" in held
    assert "budget_exceeded: 3 of 4 valid heartbeats are stale, over the budget (over 50%, at least 3)" in held
    assert "Sweep: reaper_gce_enforcement run scheduled__1, execution 0, phase enforcement." in held
    failed = mails["[reaper] gce: 1 delete failed in p2"]
    assert f"- p2 instance us-east1-b/{FAILING}: heartbeat 1 d old, quarantine 4 h" in failed
    assert "failed: delete: 403 Forbidden: POST https://***@compute.example/v1/instances/1" in failed
    assert "hunter2" not in str(mails) and "key=K" not in str(mails) and "vm-p1-0" not in str(mails)
    digest = mails["[reaper] gce: 1 resource deleted"]
    assert "- p2 instance us-east1-b/vm-p2-gone: heartbeat 1 d old, quarantine 4 h (deleted " in digest
    assert FAILING not in digest and "By scope: p2 1." in digest
    told = notified(ledger)
    assert (told.sent, told.failed, told.error) == (3, 0, msgspec.UNSET)
    # A retried record: what the first try told is in the channel's state, so nothing is told twice.
    record(s, planned, branch, results, lease)
    assert len(smtp.mails) == 3 and notified(ledger).sent == 3


def test_a_dry_run_tells_nobody(tmp_path: Path, smtp: Mailbox, ledger) -> None:
    s = sweep(tmp_path, ledger)
    assert record(s, *run(s, {"dry_run": True}))["branch"] == steps.REPORT_ONLY
    (summary,) = ledger.summaries()
    assert smtp.mails == [] and summary.notifications is msgspec.UNSET


def test_a_refused_mail_fails_no_sweep_and_is_sent_by_the_next_one(tmp_path: Path, smtp: Mailbox, ledger) -> None:
    smtp.refuse = True
    s = sweep(tmp_path, ledger, events=["held"])
    planned, branch, results, lease = run(s)
    assert record(s, planned, branch, results, lease)["outcomes"] == {"deleted": 1, "failed": 1}
    told = notified(ledger)
    assert (told.sent, told.failed, smtp.mails) == (0, 1, [])
    assert told.notices == [Sent(f"smtp:{CONN}:{','.join(OWNERS)}", "held", False, "SMTPRecipientsRefused")]
    assert ledger.notice_state(f"gce/smtp:{CONN}:{','.join(OWNERS)}") is None  # untold: the next sweep tells it
    smtp.refuse = False
    again = sweep(tmp_path / "2", ledger, run="scheduled__2", events=["held"])
    record(again, *run(again))
    assert list(smtp.by_subject()) == ["[reaper] gce: deletes held in p1"]


def test_a_mail_server_that_is_down_or_hangs_costs_the_sweep_at_most_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ledger
) -> None:
    connect(monkeypatch, free_port())  # nothing listens there
    s = sweep(tmp_path, ledger)
    planned, branch, results, lease = run(s)
    assert record(s, planned, branch, results, lease)["outcomes"] == {"deleted": 1, "failed": 1}
    told = notified(ledger)
    assert (told.sent, told.failed) == (0, 3)
    assert {n.error for n in told.notices or []} == {"ConnectionRefusedError: [Errno 111] Connection refused"}
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts, and never says a word
        connect(monkeypatch, mute.getsockname()[1], timeout=30)
        s = sweep(tmp_path / "2", ledger, run="scheduled__2", timeout="1s")
        planned, branch, results, lease = run(s)
        began = time.monotonic()
        record(s, planned, branch, results, lease)
        assert time.monotonic() - began < 5
    latest = ledger.summaries()[0].notifications
    assert isinstance(latest, Notices)
    assert latest.failed == 3 and all(n.error.startswith("not sent within 1s") for n in latest.notices or [])


def test_the_daily_digest_lists_what_the_last_window_deleted_once(tmp_path: Path, smtp: Mailbox, ledger) -> None:
    """A digest window (``digest_every`` 1h here) is read from the ledger by the first sweep after it ends."""
    first = sweep(tmp_path, ledger, events=["failed"])
    planned, branch, results, lease = run(first)
    record(first, planned, branch, results, lease)
    smtp.mails.clear()
    hour = 3600
    window_end = time.time() // hour * hour  # the deletes move into the last window, which has ended
    ledger.records.update_many({"kind": "outcome"}, {"$set": {"at": datetime.fromtimestamp(window_end - 60, UTC)}})
    s = sweep(tmp_path, ledger, events=["deleted"], digest_every="1h")
    notices.send(s, planned.summary, [], None)
    (subject,) = smtp.by_subject()
    assert subject.startswith("[reaper] gce: 1 resource deleted ") and subject.endswith(" UTC")
    body = smtp.by_subject()[subject]
    assert "The reaper's gce sweeps deleted 1 resource from" in body and "By scope: p2 1." in body
    assert "- p2 instance us-east1-b/vm-p2-gone: heartbeat 1 d old, quarantine 4 h" in body
    notices.send(s, planned.summary, [], None)
    assert len(smtp.mails) == 1


class SlackApi(BaseHTTPRequestHandler):
    """Slack as its clients see it: ``chat.postMessage`` answers ``{"ok": true}``, an Incoming Webhook ``ok``."""

    posts: ClassVar[list[tuple[str, dict[str, object]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.posts.append((self.path, body))
        answer = b'{"ok": true}' if self.path.endswith("chat.postMessage") else b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if answer.startswith(b"{") else "text/plain")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None: ...


def test_slack_and_its_webhooks_get_the_notice_as_a_code_block(tmp_path: Path, monkeypatch, ledger) -> None:
    """SlackNotifier (an API token connection) and SlackWebhookNotifier, against a local server in Slack's place."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlackApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    api = {"conn_type": "slack", "password": "xoxb-test", "extra": {"base_url": f"{base}/api/"}}
    hook = {"conn_type": "slackwebhook", "password": "T0/B0/secret", "host": f"{base}/services"}
    monkeypatch.setenv("AIRFLOW_CONN_REAPER_SLACK", json.dumps(api))
    monkeypatch.setenv("AIRFLOW_CONN_REAPER_HOOK", json.dumps(hook))
    channels: list[dict[str, object]] = [
        {"kind": "slack", "conn_id": "reaper_slack", "channel": "#ci-owners", "events": ["held"]},
        {"kind": "slack_webhook", "conn_id": "reaper_hook", "events": ["held"]},
    ]
    s = sweep(tmp_path, ledger, channels=channels)
    try:
        planned, branch, results, lease = run(s)
        record(s, planned, branch, results, lease)
    finally:
        server.shutdown()
    assert notified(ledger).sent == 2
    (api_path, posted), (hook_path, hooked) = sorted(SlackApi.posts, key=lambda p: p[0])
    assert (api_path, posted["channel"], posted["unfurl_links"]) == ("/api/chat.postMessage", "#ci-owners", False)
    assert hook_path == "/services/T0/B0/secret" and hooked["text"] == posted["text"]
    text = str(posted["text"])
    assert text.startswith("*[reaper] gce: deletes held in p1*\n```\n") and text.endswith("\n```")
    assert "budget_exceeded: 3 of 4 valid heartbeats are stale" in text
