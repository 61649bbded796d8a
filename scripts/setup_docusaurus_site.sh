#!/usr/bin/env bash
# The npm packages of the Docusaurus site the browser tests build (tests/docusaurus_site): `npm ci` once
# per lock (about a minute and 275 MB the first time). scripts/test.sh calls it; the server never needs it.
set -euo pipefail
cd "$(dirname "$0")/../tests/docusaurus_site"
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: npm not found; the Docusaurus browser test will fail" >&2
  exit 0
fi
lock_hash="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat node_modules/.ci-stamp 2>/dev/null)" != "$lock_hash" ]; then
  echo "setup: installing the Docusaurus test site's npm packages (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error && echo "$lock_hash" > node_modules/.ci-stamp
fi
