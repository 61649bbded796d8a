# Finding a supported Python, sourced by setup.sh and lock.sh (and by tests/e2e/test_wheel.py through bash).
# Every candidate is tried by running it: pyenv's shims answer `command -v python3.13` even when that version is
# not selected, and then fail when run.

SUPPORTED_PYTHONS="3.11 3.12 3.13" # keep in step with pyproject.toml's requires-python

# The interpreter's "major.minor", or nothing when it does not run.
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# Interpreters that may be one of the versions given (newest first): python3, the versioned names on PATH,
# then the versions pyenv has installed, even when pyenv itself is not on PATH (the free-threaded "3.13.0t"
# builds are left out: few wheels exist).
python_candidates() {
  local version root
  echo python3
  for version in "$@"; do echo "python$version"; done
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  if [ -d "$root/versions" ]; then
    for version in "$@"; do
      find "$root/versions" -mindepth 1 -maxdepth 1 -regex ".*/${version//./\\.}\.[0-9]+" 2>/dev/null |
        sort -rV | sed 's|$|/bin/python3|'
    done
  fi
}

# Prints the first interpreter that runs and is one of the versions given (default: every supported one, newest
# first); returns 1 when there is none.
find_python() {
  local wanted candidate found
  if [ "$#" -eq 0 ]; then
    # shellcheck disable=SC2046 # split on purpose
    set -- $(echo "$SUPPORTED_PYTHONS" | tr ' ' '\n' | sort -rV)
  fi
  wanted=" $* "
  while read -r candidate; do
    found="$(python_version "$candidate")"
    if [ -n "$found" ] && [[ "$wanted" == *" $found "* ]]; then
      command -v "$candidate"
      return 0
    fi
  done < <(python_candidates "$@")
  return 1
}

# Checks that $1 runs and is a supported version; says why not on stderr.
check_python() {
  local found
  found="$(python_version "$1")"
  if [ -z "$found" ]; then
    echo "error: PYTHON=$1 does not run" >&2
    return 1
  fi
  if [[ " $SUPPORTED_PYTHONS " != *" $found "* ]]; then
    echo "error: PYTHON=$1 is Python $found; supported: ${SUPPORTED_PYTHONS// /, }" >&2
    return 1
  fi
}
