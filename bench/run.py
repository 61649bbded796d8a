"""Every benchmark in bench/, one after another, and one table of their figures.

    .venv/bin/python -m bench.run [--quick] [--only NAME ...] [--skip NAME ...] [--json PATH]

A benchmark is any module here whose ``main`` takes ``--json PATH`` (found by reading the sources, so a new
one joins without changes here); ``--quick`` is passed on to those that accept it. Each runs as its own
subprocess with its output kept in a log; one that fails or times out is reported and the rest still run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.figures import Figure, read, table, write

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
NOT_BENCHMARKS = {"__init__", "figures", "run"}
TIMEOUT_S = {False: 15 * 60, True: 6 * 60}  # per benchmark, by --quick


@dataclass(frozen=True)
class Benchmark:
    name: str
    quick: bool  # accepts --quick


@dataclass(frozen=True)
class Outcome:
    name: str
    figures: list[Figure]
    seconds: float
    error: str | None = None


def discover() -> tuple[list[Benchmark], list[str]]:
    """(benchmarks, modules skipped because their ``main`` writes no figures)."""
    found, skipped = [], []
    for path in sorted(BENCH_DIR.glob("*.py")):
        if path.stem in NOT_BENCHMARKS:
            continue
        source = path.read_text()
        if '"--json"' in source and "def main(" in source:
            found.append(Benchmark(path.stem, '"--quick"' in source))
        else:
            skipped.append(path.stem)
    return found, skipped


def run_one(benchmark: Benchmark, *, quick: bool, workdir: Path) -> Outcome:
    output = workdir / f"{benchmark.name}.json"
    log = workdir / f"{benchmark.name}.log"
    argv = [sys.executable, "-m", f"bench.{benchmark.name}", "--json", str(output)]
    if quick and benchmark.quick:
        argv.append("--quick")
    started = time.monotonic()
    with log.open("wb") as sink:
        try:
            code = subprocess.run(
                argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, timeout=TIMEOUT_S[quick]
            ).returncode
        except subprocess.TimeoutExpired:
            return Outcome(benchmark.name, [], time.monotonic() - started, f"timed out after {TIMEOUT_S[quick]} s")
    seconds = time.monotonic() - started
    if code != 0:
        return Outcome(benchmark.name, [], seconds, f"exit {code}: {_last_line(log)}")
    if not output.exists():
        return Outcome(benchmark.name, [], seconds, "wrote no figures")
    try:
        return Outcome(benchmark.name, read(output), seconds)
    except (ValueError, TypeError) as exc:
        return Outcome(benchmark.name, [], seconds, f"unreadable figures: {exc}")


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark that has it")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run just these benchmarks")
    parser.add_argument("--skip", nargs="+", default=[], metavar="NAME", help="leave these out")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here (bench/figures.py)")
    parser.add_argument("--logs", type=Path, default=None, help="keep each benchmark's output in this folder")
    args = parser.parse_args()

    benchmarks, skipped = discover()
    chosen = [b for b in benchmarks if (args.only is None or b.name in args.only) and b.name not in args.skip]
    unknown = set(args.only or []) - {b.name for b in benchmarks}
    if unknown:
        parser.error(f"no benchmark named {', '.join(sorted(unknown))} (have: {', '.join(b.name for b in benchmarks)})")
    if skipped:
        print(f"not benchmarks (no --json): {', '.join(skipped)}")
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        outcomes = []
        for benchmark in chosen:
            print(f"running bench.{benchmark.name}{' --quick' if args.quick and benchmark.quick else ''} …", flush=True)
            outcome = run_one(benchmark, quick=args.quick, workdir=workdir)
            status = "failed: " + outcome.error if outcome.error else f"{len(outcome.figures)} figures"
            print(f"  {outcome.seconds:.0f} s, {status}", flush=True)
            outcomes.append(outcome)
        if args.logs is None and any(o.error for o in outcomes):
            print("(run with --logs DIR to keep the failing benchmarks' output)")

    figures = [f for o in outcomes for f in o.figures]
    print()
    print(table(figures))
    failed = [o for o in outcomes if o.error]
    for outcome in failed:
        print(f"FAILED bench.{outcome.name}: {outcome.error}")
    missed = [f.name for f in figures if f.meets_target is False]
    print(f"\n{len(outcomes) - len(failed)}/{len(outcomes)} benchmarks ran; {len(missed)} figure(s) miss their target")
    write(figures, args.json)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT / "data" / "tiktoken"))
    main()
