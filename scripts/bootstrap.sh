#!/usr/bin/env bash
# Installs the system packages the project needs, where they are missing (Debian/Ubuntu, as root or via sudo).
# Idempotent: a machine that already has everything is left untouched.
set -euo pipefail

PYTHON=${PYTHON:-python3}
missing=()

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "bootstrap: $PYTHON not found; install Python 3.11 or newer" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: $PYTHON is $("$PYTHON" -V 2>&1); reaper needs Python 3.11 or newer" >&2
  exit 1
fi
# Debian's python3 ships venv and ensurepip separately.
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || missing+=("python3-venv")
# Prometheus: the writer-health source is tested against a real server; promtool checks the alert rules.
command -v prometheus >/dev/null 2>&1 || missing+=("prometheus")
command -v prometheus-pushgateway >/dev/null 2>&1 || missing+=("prometheus-pushgateway")
# Alertmanager and amtool: the runbook's suggested route and recovery silence are tested against a real one.
command -v amtool >/dev/null 2>&1 || missing+=("prometheus-alertmanager")
# NATS with JetStream (lease source) and PostgreSQL (step-run store) are real servers in the tests.
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || missing+=("nats-server")
command -v pg_ctlcluster >/dev/null 2>&1 || missing+=("postgresql")
# Redis: the CeleryExecutor's broker (the Celery tests and `make demo EXECUTOR=celery` start their own).
command -v redis-server >/dev/null 2>&1 || missing+=("redis-server")
# curl and jq: the README's deployment guide uses them, and its test runs that guide as written.
command -v curl >/dev/null 2>&1 || missing+=("curl")
command -v jq >/dev/null 2>&1 || missing+=("jq")
# The audit view is tested once in a real browser.
command -v chromium >/dev/null 2>&1 || missing+=("chromium")
command -v chromedriver >/dev/null 2>&1 || missing+=("chromium-driver")

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

# A PostgreSQL server on 127.0.0.1:5432. The postgres role is left as it is: the tests and the demo log in
# as a role of their own, reaper_dev (may create databases and roles; no superuser), whose password is made
# here and kept where libpq looks for passwords, the user's ~/.pgpass (or $PGPASSFILE; only its owner may read
# it): no URL, command line or file of the checkout holds it (include/local_postgres.py).
if ! "$PYTHON" - <<'PY' 2>/dev/null
import socket; socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
PY
then
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$version" ]; then
    echo "bootstrap: starting PostgreSQL $version"
    $sudo pg_ctlcluster --skip-systemctl-redirect "$version" main start
  fi
fi
pgpass="${PGPASSFILE:-$HOME/.pgpass}"
if ! grep -qs '^127\.0\.0\.1:5432:\*:reaper_dev:' "$pgpass" && id postgres >/dev/null 2>&1 \
  && command -v psql >/dev/null 2>&1; then
  password=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(24))')
  if $sudo runuser -u postgres -- psql -q -v ON_ERROR_STOP=1 >/dev/null 2>&1 <<SQL
SELECT format('%s ROLE reaper_dev LOGIN CREATEDB CREATEROLE PASSWORD %L',
              CASE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = 'reaper_dev') THEN 'ALTER' ELSE 'CREATE' END,
              '$password') \gexec
SQL
  then
    (umask 077 && echo "127.0.0.1:5432:*:reaper_dev:$password" >> "$pgpass")
    chmod 600 "$pgpass"
    echo "bootstrap: PostgreSQL role reaper_dev made; its password is in $pgpass"
  fi
fi
