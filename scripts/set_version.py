"""Set the one version of the server, its wheel and the panel: textbook_chat/__init__.py, frontend/package.json and
frontend/package-lock.json (``/health`` reports it; the wheel reads it from server/textbook_chat/__init__.py).

    .venv/bin/python scripts/set_version.py 0.2.0
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "server" / "textbook_chat" / "__init__.py"
PACKAGE = ROOT / "frontend" / "package.json"
LOCK = ROOT / "frontend" / "package-lock.json"
_VERSION = re.compile(r"\d+\.\d+\.\d+(?:[-.]?(?:a|b|rc|dev)\d+)?")
_INIT_LINE = re.compile(r'^__version__ = "[^"]*"$', re.MULTILINE)


def set_version(version: str, root: Path = ROOT) -> None:
    """Write ``version`` into the three files under ``root``."""
    if not _VERSION.fullmatch(version):
        raise ValueError(f"{version!r} is not a version such as 1.2.3 or 1.2.3rc1")
    init = root / INIT.relative_to(ROOT)
    text, count = _INIT_LINE.subn(f'__version__ = "{version}"', init.read_text(encoding="utf-8"))
    if count != 1:
        raise ValueError(f"{init} has no single __version__ line")
    init.write_text(text, encoding="utf-8")
    package = root / PACKAGE.relative_to(ROOT)
    data = json.loads(package.read_text(encoding="utf-8"))
    data["version"] = version
    package.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lock = root / LOCK.relative_to(ROOT)
    data = json.loads(lock.read_text(encoding="utf-8"))
    data["version"] = data["packages"][""]["version"] = version
    lock.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Set the version of the server, the wheel and the panel.")
    parser.add_argument("version", help="e.g. 0.2.0")
    args = parser.parse_args(argv)
    try:
        set_version(args.version)
    except ValueError as exc:
        print(f"set_version: {exc}", file=sys.stderr)
        return 2
    print(
        f"version {args.version}: server/textbook_chat/__init__.py, frontend/package.json, frontend/package-lock.json"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
