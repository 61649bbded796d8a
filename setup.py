"""The wheel's build step: copies what the server reads from the repository into ``server/textbook_chat/_bundled/``.

Everything else about the package is in pyproject.toml. The repository keeps its layout (``frontend/dist``,
``migrations/``, ``alembic.ini``, ``faq/``, ``examples/textbook``, ``data/tiktoken``); the wheel carries the same
paths under ``server/textbook_chat/_bundled/``, where ``server/textbook_chat/core/resources.py`` finds them. Build with
``scripts/build_wheel.sh``, which first builds the panel and fills tiktoken's files (``scripts/setup.sh``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Keep in step with server/textbook_chat/core/resources.py BUNDLED (tests/test_packaging.py checks they agree).
BUNDLED = ("frontend/dist", "migrations", "alembic.ini", "faq", "examples/textbook", "data/tiktoken")
# What must be there for the wheel to work, and how to make it when it is not.
REQUIRED = {
    "frontend/dist/manifest.json": "the built panel: run scripts/setup.sh (or: cd frontend && npm ci && npm run build)",
    "data/tiktoken": "tiktoken's files: run scripts/setup.sh (or: python scripts/fill_tiktoken_cache.py)",
}
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".build-stamp")


class BuildWithBundle(build_py):
    """``build_py``, then the repository files the server reads, copied into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install runs from the checkout and reads the repository's own folders
        missing = [f"{path} ({how})" for path, how in REQUIRED.items() if not (ROOT / path).exists()]
        if missing:
            raise SystemExit("cannot build the wheel, missing: " + "; ".join(missing))
        bundle = Path(self.build_lib) / "textbook_chat" / "_bundled"
        shutil.rmtree(bundle, ignore_errors=True)
        for relative in BUNDLED:
            source, target = ROOT / relative, bundle / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, ignore=_SKIP)
            else:
                shutil.copy2(source, target)


setup(cmdclass={"build_py": BuildWithBundle})
