"""Sending notices (:mod:`reaper.notify`) through Airflow's own notifiers, each with its channel's Airflow connection.

``smtp``: the SMTP provider's ``SmtpNotifier``; ``slack``: the Slack provider's ``SlackNotifier`` (an API token
connection); ``slack_webhook``: its ``SlackWebhookNotifier`` (an Incoming Webhook connection). A notifier is
called through ``BaseNotifier.notify`` with an empty context, never through ``__call__``, which would render
the message as a Jinja template: a notice quotes resource names, which must never be run as one.

All of a sweep's notices go out side by side, each in a thread of its own, and the sweep waits for them at most
its budget: a mail server that hangs cannot hold the sweep's task past its run's timeout. A notice not sent by
then is counted as failed (it may still arrive); an error is reported by its type only when its text could
quote a URL or an address (:func:`reaper.redact.error_for_log`).
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from reaper.config import NotifyChannel
from reaper.notify import Notice
from reaper.records import Sent
from reaper.redact import error_for_log

if TYPE_CHECKING:
    from airflow.sdk.bases.notifier import BaseNotifier

log = logging.getLogger(__name__)
SLACK_TEXT_CHARS = 39_000  # Slack truncates a message's text past 40,000 characters


def notifier(channel: NotifyChannel, notice: Notice, timeout: float) -> BaseNotifier:
    """The provider's notifier of ``channel.kind`` carrying ``notice`` (``timeout``: the Slack client's, seconds)."""
    if channel.kind == "smtp":
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        # The SMTP client's timeout and retries are the connection's (extras timeout, retry_limit).
        return SmtpNotifier(
            to=channel.to,
            from_email=channel.from_email or None,
            subject=notice.subject,
            html_content=as_html(notice.text),
            smtp_conn_id=channel.conn_id or None,
        )
    text = slack_text(notice)
    seconds = max(1, int(timeout))
    if channel.kind == "slack":
        from airflow.providers.slack.notifications.slack import SlackNotifier

        return SlackNotifier(
            slack_conn_id=channel.conn_id or "slack_api_default",
            text=text,
            channel=channel.channel,
            username="reaper",
            unfurl_links=False,
            unfurl_media=False,
            timeout=seconds,
        )
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    return SlackWebhookNotifier(
        slack_webhook_conn_id=channel.conn_id or "slack_default",
        text=text,
        unfurl_links=False,
        unfurl_media=False,
        timeout=seconds,
    )


def as_html(text: str) -> str:
    """A notice's text as a mail's HTML body: escaped, its lines and indents kept."""
    return f'<pre style="font-family: sans-serif; white-space: pre-wrap">{html.escape(text)}</pre>'


def slack_text(notice: Notice) -> str:
    """A notice as a Slack message: the subject in bold, the text as a code block (names keep their underscores),
    ``&``, ``<`` and ``>`` escaped as Slack requires (a name can then never be read as a mention or a link)."""
    body = notice.text if len(notice.text) <= SLACK_TEXT_CHARS else notice.text[:SLACK_TEXT_CHARS] + "\n..."

    def escape(s: str) -> str:
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    return f"*{escape(notice.subject)}*\n```\n{escape(body)}\n```"


def send_all(notices: Sequence[tuple[NotifyChannel, Notice]], budget: float) -> list[Sent]:
    """Send every notice, side by side; what became of each, in order, within ``budget`` seconds.

    Never raises: a notifier's error is its notice's ``error``, a notice not sent within the budget is failed.
    """
    results: dict[int, Sent] = {}

    def send(i: int, channel: NotifyChannel, notice: Notice) -> None:
        try:
            notifier(channel, notice, budget).notify({})
        except Exception as exc:  # any notifier's or provider's failure is this notice's, never the sweep's
            results[i] = Sent(channel.key, notice.event, False, error_for_log(exc))
        else:
            results[i] = Sent(channel.key, notice.event, True)

    threads = [
        threading.Thread(target=send, args=(i, c, n), name=f"reaper-notice-{i}", daemon=True)
        for i, (c, n) in enumerate(notices)
    ]
    give_up = time.monotonic() + budget
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, give_up - time.monotonic()))
    late = f"not sent within {budget:.0f}s (notifications.timeout, or the time left before the run's timeout)"
    sent = [results.get(i) or Sent(c.key, n.event, False, late) for i, (c, n) in enumerate(notices)]
    for s in sent:
        if s.ok:
            log.info("notice sent: %s to %s", s.event, s.channel)
        else:
            log.warning("notice not sent: %s to %s: %s", s.event, s.channel, s.error)
    return sent
