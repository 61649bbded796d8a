"""The CPUs a process may use: its affinity, not the machine's count (a pinned server sizes its threads by it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from textbook_chat.core import cpus


def test_a_process_pinned_to_one_core_counts_one() -> None:
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("this platform has no CPU affinity")
    code = (
        "import os; from textbook_chat.core import cpus; "
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(cpus.usable())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"


def test_an_unpinned_process_counts_the_cores_it_may_run_on() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert cpus.usable() == expected >= 1
