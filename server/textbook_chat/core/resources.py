"""Where the server's own files are: the built panel, the migrations, the FAQ, the demo book, tiktoken's files.

From a checkout they are the repository's folders (``frontend/dist``, ``migrations/`` and ``alembic.ini``,
``faq/``, ``examples/textbook``). A built wheel carries copies of the same paths under ``textbook_chat/_bundled/``
(``setup.py`` puts them there, ``BUNDLED`` names them), and that folder's presence is what says "installed":
the installed command keeps its data in a per-user folder instead of ``./data``, and reads tiktoken's BPE
files from the wheel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "textbook-chat"
PACKAGE = Path(__file__).resolve().parents[1]  # textbook_chat/ (in a checkout: server/textbook_chat/)
BUNDLE = "_bundled"
# The repository paths a wheel carries, relative to the project root (setup.py copies exactly these).
BUNDLED = ("frontend/dist", "migrations", "alembic.ini", "faq", "examples/textbook", "data/tiktoken")


@dataclass(frozen=True)
class Resources:
    root: Path  # the checkout's root, or the wheel's server/textbook_chat/_bundled/
    installed: bool

    @property
    def panel(self) -> Path:
        """The built chat panel (Vite's ``dist``: ``manifest.json`` and the assets)."""
        return self.root / "frontend" / "dist"

    @property
    def alembic_ini(self) -> Path:
        return self.root / "alembic.ini"

    @property
    def migrations(self) -> Path:
        return self.root / "migrations"

    @property
    def faq(self) -> Path:
        return self.root / "faq" / "faq.json"

    @property
    def demo_book(self) -> Path:
        return self.root / "examples" / "textbook"

    @property
    def tiktoken(self) -> Path | None:
        """tiktoken's BPE files shipped with the wheel; from a checkout they live in ``DATA_DIR/tiktoken``."""
        return self.root / "data" / "tiktoken" if self.installed else None

    @property
    def default_data_dir(self) -> Path:
        """``./data`` in a checkout; the per-user data folder (XDG on Linux) for the installed command."""
        if not self.installed:
            return Path("./data")
        return user_data_dir()


def locate(package: Path = PACKAGE) -> Resources:
    """The installed wheel's bundle when ``package`` has one, else the checkout around ``package``."""
    bundle = package / BUNDLE
    if bundle.is_dir():
        return Resources(bundle, installed=True)
    return Resources(package.parents[1], installed=False)  # the checkout: server/textbook_chat/ -> ./


@functools.cache
def current() -> Resources:
    return locate()


def user_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
