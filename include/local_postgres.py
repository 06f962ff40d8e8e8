"""The local PostgreSQL server the demo and the tests use, as a URL without a database (and without a password).

``REAPER_LOCAL_POSTGRES`` when set; else the role ``scripts/bootstrap.sh`` made, ``reaper_dev``, whose password
it keeps in the user's password file (``~/.pgpass`` or ``$PGPASSFILE``), where libpq, psql and createdb find it:
never the ``postgres`` role's, never on a command line; else ``postgres`` without a password, which a server
with trust authentication on 127.0.0.1 (a CI machine's) lets in. ``python -m include.local_postgres`` prints it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROLE = "reaper_dev"
LINE = re.compile(rf"^127\.0\.0\.1:5432:\*:{ROLE}:", re.M)
TRUSTED = "postgresql://postgres@127.0.0.1:5432"


def password_file() -> Path:
    """Where libpq reads passwords from (https://www.postgresql.org/docs/current/libpq-pgpass.html)."""
    return Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")


def server_url() -> str:
    """``postgresql://user@host:port``: append ``/<database>``."""
    if url := os.environ.get("REAPER_LOCAL_POSTGRES", "").strip():
        return url.rstrip("/")
    try:
        made = bool(LINE.search(password_file().read_text()))
    except OSError:
        made = False
    return f"postgresql://{ROLE}@127.0.0.1:5432" if made else TRUSTED


if __name__ == "__main__":
    print(server_url())
