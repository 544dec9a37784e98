#!/usr/bin/env bash
# Creates .venv (pip) with torch 2.13.0 (CPU build on these machines), the project and the loader package.
# Idempotent: a second call only re-checks the installs.
set -euo pipefail
cd "$(dirname "$0")/.."

pip_install() {
  # this machine's pip config names find-links folders that may not exist: drop that noise, keep real errors
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

[ -x .venv/bin/python ] || python3 -m venv .venv
pip_install torch==2.13.0
pip_install -e ".[test,postgres]" -e ./loaders
mkdir -p dagster_home
