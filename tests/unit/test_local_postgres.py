"""The local PostgreSQL the demo and the tests reach (``include.local_postgres``): no password in any URL."""

from __future__ import annotations

from include.local_postgres import TRUSTED, server_url


def test_the_role_bootstrap_made_is_found_by_its_line_in_the_password_file(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("REAPER_LOCAL_POSTGRES", raising=False)
    pgpass = tmp_path / "pgpass"
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    assert server_url() == TRUSTED  # no file: a trust-auth server's postgres
    pgpass.write_text("db.internal:5432:*:app:x\n")
    assert server_url() == TRUSTED  # another server's line
    pgpass.write_text("db.internal:5432:*:app:x\n127.0.0.1:5432:*:reaper_dev:0123abcd\n")
    assert server_url() == "postgresql://reaper_dev@127.0.0.1:5432"  # the password stays in the file
    monkeypatch.setenv("REAPER_LOCAL_POSTGRES", "postgresql://me@db:6432/")
    assert server_url() == "postgresql://me@db:6432"
