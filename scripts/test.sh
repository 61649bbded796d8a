#!/usr/bin/env bash
# Set up, then run every check CI runs: formatting, lint, types, import contracts, and the whole test suite
# (which also builds the wheel and serves the demo book from it on another Python: tests/e2e/test_wheel.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The Docusaurus test site's packages install meanwhile (network and disk, mostly); its test waits for them.
mkdir -p test-output
scripts/setup_docusaurus_site.sh > test-output/docusaurus-setup.log 2>&1 &
export TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$PWD/data/tiktoken}"
# This checkout first on the path (lint-imports, mypy and the commands tests start), whatever the venv's .pth says.
export PYTHONPATH="$PWD/server:$PWD${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/ruff format --check server tests migrations scripts bench setup.py
.venv/bin/ruff check server tests migrations scripts bench setup.py
.venv/bin/mypy
.venv/bin/lint-imports  # the import contracts in pyproject.toml
(cd frontend && npx --no-install vitest run)
.venv/bin/pytest "$@"
