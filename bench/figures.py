"""The one shape every benchmark reports in, so ``bench.run`` can print them all as one table.

A benchmark prints its own readable output and, given ``--json PATH``, also writes its figures there
as a list of :class:`Figure` dicts. ``target`` is the issue's target (``None``: reported only);
``ceiling`` is a reference measured in the same run (e.g. a minimal relay), when there is one.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    target: float | None = None
    better: Literal["lower", "higher"] = "lower"  # which side of the target passes
    ceiling: float | None = None

    @property
    def meets_target(self) -> bool | None:
        if self.target is None:
            return None
        return self.value <= self.target if self.better == "lower" else self.value >= self.target

    @property
    def ratio_to_ceiling(self) -> float | None:
        if not self.ceiling:
            return None
        return self.value / self.ceiling


def write(figures: list[Figure], path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps([asdict(f) for f in figures], indent=2))


def read(path: Path) -> list[Figure]:
    return [Figure(**item) for item in json.loads(path.read_text())]


def table(figures: list[Figure]) -> str:
    lines = [f"{'figure':<58} {'value':>12} {'unit':<9} {'target':>12} {'ok':<4} {'ratio to ceiling':>16}"]
    for f in figures:
        target = "" if f.target is None else f"{'≤' if f.better == 'lower' else '≥'} {f.target:g}"
        ok = {True: "yes", False: "NO", None: ""}[f.meets_target]
        ratio = "" if f.ratio_to_ceiling is None else f"{f.ratio_to_ceiling:.2f}"
        lines.append(f"{f.name:<58} {f.value:>12.4g} {f.unit:<9} {target:>12} {ok:<4} {ratio:>16}")
    return "\n".join(lines)


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (1–99), inclusive method; a single value is its own percentile."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
