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

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "bootstrap: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
