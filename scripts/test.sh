#!/usr/bin/env bash
# Set up, then run every check CI runs: formatting, lint, types, import contracts, the panel's tests and the whole
# test suite (which also builds the wheel and serves the demo book from it on another Python: tests/e2e/test_wheel.py).
#
#   scripts/test.sh            everything (what CI runs: .ci/run)
#   scripts/test.sh --quick    the developer's loop: the same static checks and vitest, then pytest without the tests
#                              marked slow or wheel (-m "not slow and not wheel"); set-up steps already done are skipped
#   scripts/test.sh [--quick] -k store -x    extra arguments go to pytest
# pytest runs on TEST_WORKERS processes (pytest-xdist; default 2, at most 3: each takes its own Redis DB from 13 up),
# a test file to a worker, so a file's module fixtures are built once; TEST_WORKERS=0 runs in this process alone.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
scripts/setup.sh
mkdir -p test-output
if [ "$quick" -eq 0 ]; then
  # The Docusaurus test site's packages install meanwhile (network and disk, mostly); its test waits for them.
  scripts/setup_docusaurus_site.sh > test-output/docusaurus-setup.log 2>&1 &
fi
export TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$PWD/data/tiktoken}"
# This checkout first on the path (lint-imports, mypy and the commands tests start), whatever the venv's .pth says.
export PYTHONPATH="$PWD/server:$PWD${PYTHONPATH:+:$PYTHONPATH}"
parallel=(-n "${TEST_WORKERS:-2}" --dist loadfile --durations=15)

static_checks() {
  .venv/bin/ruff format --check server tests migrations scripts bench setup.py
  .venv/bin/ruff check server tests migrations scripts bench setup.py
  .venv/bin/mypy
  .venv/bin/lint-imports # the import contracts in pyproject.toml
  (cd frontend && npx --no-install vitest run)
}

selection=()
[ "$quick" -eq 1 ] && selection=(-m "not slow and not wheel")
# The static checks (mostly one core: mypy) run beside pytest, whose workers often wait on servers and browsers;
# their output is printed after it, and either failing fails the run.
static_log=test-output/static-checks.log
static_checks > "$static_log" 2>&1 &
static=$!
status=0
.venv/bin/pytest "${parallel[@]}" "${selection[@]}" "$@" || status=$?
static_ok=0
wait "$static" || static_ok=$?
cat "$static_log"
if [ "$static_ok" -eq 0 ]; then
  echo "static checks (ruff, mypy, import contracts, vitest): passed ($static_log)"
else
  echo "static checks failed: $static_log"
  status=1
fi
exit "$status"
