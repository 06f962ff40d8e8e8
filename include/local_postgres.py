"""The local PostgreSQL server the demo and the tests use, as a URL without a database.

``REAPER_LOCAL_POSTGRES`` when set; else the role ``scripts/bootstrap.sh`` made for this checkout
(``var/postgres-url``: its own password, never the ``postgres`` role's); else ``postgres`` without a
password, which a server with trust authentication on 127.0.0.1 (a CI machine's) lets in.
"""

from __future__ import annotations

import os
from pathlib import Path

URL_FILE = Path(__file__).resolve().parents[1] / "var" / "postgres-url"
TRUSTED = "postgresql://postgres@127.0.0.1:5432"


def server_url() -> str:
    """``postgresql://user[:password]@host:port``: append ``/<database>``."""
    if url := os.environ.get("REAPER_LOCAL_POSTGRES", "").strip():
        return url.rstrip("/")
    if URL_FILE.is_file() and (url := URL_FILE.read_text().strip()):
        return url
    return TRUSTED
