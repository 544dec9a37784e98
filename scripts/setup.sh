#!/usr/bin/env bash
# Creates .venv (pip) with torch 2.13.0 (CPU build on these machines), the project and the loader package.
# Idempotent: a second call only re-checks the installs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" -e ./loaders
mkdir -p dagster_home
