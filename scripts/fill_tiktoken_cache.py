"""Fill a TIKTOKEN_CACHE_DIR offline: rebuild tiktoken's BPE files from the npm package js-tiktoken.

tiktoken downloads `<name>.tiktoken` on first use and caches it as `sha1(url)`, checking its sha256
(tiktoken/load.py); js-tiktoken ships the same ranks as JS modules, so rebuilding them needs only npm.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

JS_TIKTOKEN = "js-tiktoken@1.0.21"
_NPM_TIMEOUT_S = 120


@dataclass(frozen=True)
class Encoding:
    name: str
    url: str  # tiktoken_ext/openai_public.py: the cache file is named by the sha1 of this
    sha256: str  # ... and must hash to this, or tiktoken deletes it and tries to download

    def cache_path(self, cache_dir: Path) -> Path:
        return cache_dir / hashlib.sha1(self.url.encode()).hexdigest()


ENCODINGS = (
    Encoding(
        "cl100k_base",
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    Encoding(
        "o200k_base",
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
)


class FillError(Exception):
    """Why the cache could not be filled, as one line."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", type=Path, default=Path("data/tiktoken"), help="cache folder (TIKTOKEN_CACHE_DIR)")
    args = parser.parse_args(argv)
    try:
        filled = fill(args.target)
    except FillError as exc:
        print(f"fill_tiktoken_cache: {exc}", file=sys.stderr)
        return 1
    if filled:
        print(f"fill_tiktoken_cache: wrote {', '.join(filled)} to {args.target}")
    return 0


def fill(cache_dir: Path) -> list[str]:
    """Write every missing or corrupt encoding into ``cache_dir``; returns the names written."""
    missing = [enc for enc in ENCODINGS if not _valid(enc.cache_path(cache_dir), enc.sha256)]
    if not missing:
        return []
    with tempfile.TemporaryDirectory(prefix="js-tiktoken-") as tmp:
        package = _unpack(Path(tmp))
        cache_dir.mkdir(parents=True, exist_ok=True)
        for enc in missing:
            data = to_tiktoken_file((package / "dist" / "ranks" / f"{enc.name}.js").read_text(encoding="utf-8"))
            digest = hashlib.sha256(data).hexdigest()
            if digest != enc.sha256:
                raise FillError(f"{JS_TIKTOKEN} {enc.name} rebuilds to sha256 {digest}, tiktoken expects {enc.sha256}")
            _write_atomically(enc.cache_path(cache_dir), data)
    return [enc.name for enc in missing]


def to_tiktoken_file(module_source: str) -> bytes:
    """A js-tiktoken ranks module (`export default {..., "bpe_ranks": "..."}`) as a `.tiktoken` file.

    js-tiktoken compresses the ranks as lines `<label> <first rank> <b64 token> <b64 token>...`
    with consecutive ranks; tiktoken wants one `<b64 token> <rank>` line per token, in rank order.
    """
    body = module_source.strip().removeprefix("export default").strip().removesuffix(";")
    try:
        compressed = json.loads(body)["bpe_ranks"]
    except (ValueError, KeyError, TypeError) as exc:
        raise FillError(f"unexpected js-tiktoken ranks module ({type(exc).__name__}: {exc})") from exc
    ranks: dict[int, bytes] = {}
    for line in compressed.split("\n"):
        if not line:
            continue
        _, first, *tokens = line.split(" ")
        for offset, token in enumerate(tokens):
            ranks[int(first) + offset] = base64.b64decode(token)
    return b"".join(base64.b64encode(ranks[rank]) + b" %d\n" % rank for rank in sorted(ranks))


def _valid(path: Path, sha256: str) -> bool:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    except OSError:
        return False


def _unpack(workdir: Path) -> Path:
    """`npm pack` the pinned package (from npm's cache when it has it) and extract it; returns its folder."""
    npm = shutil.which("npm")
    if npm is None:
        raise FillError("npm not found; cannot rebuild tiktoken's BPE files (token counts fall back to MiniLM)")
    try:
        done = subprocess.run(
            [npm, "pack", JS_TIKTOKEN, "--silent", "--pack-destination", str(workdir)],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=_NPM_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise FillError(
            f"`npm pack {JS_TIKTOKEN}` took over {_NPM_TIMEOUT_S} s (is the npm registry reachable?)"
        ) from None
    tarballs = sorted(workdir.glob("*.tgz"))
    if done.returncode != 0 or not tarballs:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FillError(f"`npm pack {JS_TIKTOKEN}` failed: {last}")
    with tarfile.open(tarballs[0]) as archive:
        archive.extractall(workdir, filter="data")
    return workdir / "package"


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
