#!/usr/bin/env bash
# Set up, then serve the demo textbook on the embedded defaults (no Docker, no API key):
# http://127.0.0.1:8000 . Pass serve flags through, e.g. scripts/run.sh --port 9000.
# The demo book is ingested at start (incremental: a restart with nothing changed embeds nothing), and
# citation links point at this server's own rendering of the book unless BOOK_BASE_URL says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$PWD/data/tiktoken}"
port=8000
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --port) port="${args[$((i + 1))]:-8000}" ;;
    --port=*) port="${args[$i]#--port=}" ;;
  esac
done
export BOOK_BASE_URL="${BOOK_BASE_URL:-http://127.0.0.1:$port}"
exec .venv/bin/python -m textbook_chat serve --book examples/textbook "$@"
