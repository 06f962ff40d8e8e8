"""Keeping credentials out of log lines: URLs the config names may carry ``user:password@``.

Prometheus and the Pushgateway are reached through URLs from the config; a URL with credentials
in it must never reach a log line or an exception message the reaper writes.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


def url_for_log(url: str) -> str:
    """``url`` without its user and password (``***@`` in their place), or a placeholder if unparseable."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable URL>"
    netloc = f"***@{host}{port}" if "@" in parts.netloc else parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def error_for_log(exc: BaseException) -> str:
    """An exception for a log line: its type, and its text only when it cannot quote a URL.

    ``requests`` and ``urllib`` put the whole URL, credentials included, into their messages.
    """
    text = str(exc)
    return type(exc).__name__ if "://" in text or "@" in text else f"{type(exc).__name__}: {text}"


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
# A bare ``user:password@`` (the password may hold @): ``u:p@ss@host`` is ``***@host``.
_USERINFO = re.compile(r"[^\s/@'\"<>]+:[^\s/'\"<>]*@")
# Secrets that are no userinfo: a bearer, basic or token authorization, a key=value or "key": "value" whose key
# names a secret (libpq's password=, a JSON access_token), and a Slack webhook's path.
_TOKENS = re.compile(
    r"(?i)(\b(?:bearer|basic|token)\s+)[^\s'\"<>,;]+"
    r"|(\b(?:password|passwd|pwd|token|access_token|refresh_token|api[_-]?key|secret|client_secret)"
    r"[\"']?\s*[=:]\s*[\"']?)[^\s'\"<>,;&]+"
    r"|(hooks\.slack\.com/)[^\s'\"<>]+"
)


def text_for_log(text: str) -> str:
    """Free text (an API's error message) with every URL as :func:`url_for_log` gives it (no credentials, no
    query) and any other ``user:password@`` masked: for text that leaves the reaper, such as a notice."""
    masked = _TOKENS.sub(lambda m: f"{m.group(1) or m.group(2) or m.group(3)}***", text)
    return _USERINFO.sub("***@", _URL.sub(lambda m: url_for_log(m.group(0)), masked))
