#!/usr/bin/env bash
# Build the wheel into dist/ (or the folder given): textbook_chat-<version>-py3-none-any.whl, carrying the
# panel, migrations, FAQ, demo book and tiktoken's files (setup.py). Install it anywhere with
#   pipx install ./dist/textbook_chat-*.whl     (or: uv tool install ./dist/textbook_chat-*.whl)
# then, from any folder: textbook-chat serve --book ./docs
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh # builds the panel and fills data/tiktoken, which the wheel carries
out="${1:-dist}"
rm -rf build # setuptools' staging folder: a file left from an earlier build would ride along
.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$out" .
echo "built $(ls -t "$out"/textbook_chat-*.whl | head -1)"
