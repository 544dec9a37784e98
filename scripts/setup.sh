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

step() { echo "setup: $*" >&2; }

[ -x .venv/bin/python ] || { step "creating .venv"; python3 -m venv .venv; }
step "torch 2.13.0 (CPU build; first time about a minute)"
pip_install torch==2.13.0
step "tokenmill, dagster, the loader and test tools (first time a few minutes)"
pip_install -e ".[test,postgres,ray,extractors]" -e ./loaders
# an editable install leaves the project's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set every
# process (the run and each worker) would compile them again at import: compile them once, as pip does for a wheel
.venv/bin/python -m compileall -q tokenmill assets resources loaders/tokenmill_loader definitions.py automation.py >/dev/null
step "Dagster instance in ./dagster_home"
mkdir -p dagster_home
# create the embedded instance's tables now: two first runs racing to create them fail with "table runs already exists"
DAGSTER_HOME=$PWD/dagster_home .venv/bin/dagster instance migrate >/dev/null
