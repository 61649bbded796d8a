#!/usr/bin/env bash
# The npm packages of the Docusaurus site the browser tests build (tests/docusaurus_site): `npm ci` once
# per lock (about a minute and 275 MB the first time). scripts/test.sh runs it in the background while the
# other checks run; the Docusaurus test waits while `.installing` is there, and reads the outcome from
# `node_modules/.ci-stamp` (done) or `.install-failed`. The server never needs any of it.
set -euo pipefail
cd "$(dirname "$0")/../tests/docusaurus_site"
rm -f .install-failed
if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found" > .install-failed
  exit 0
fi
lock_hash="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat node_modules/.ci-stamp 2>/dev/null)" != "$lock_hash" ]; then
  echo $$ > .installing
  trap 'rm -f .installing' EXIT
  echo "setup: installing the Docusaurus test site's npm packages (npm ci)"
  if npm ci --no-audit --no-fund --loglevel=error; then
    echo "$lock_hash" > node_modules/.ci-stamp
  else
    echo "npm ci failed (exit $?)" > .install-failed
    exit 1
  fi
fi
