"""How many CPUs this process may run on: its affinity (``taskset``, a container's cpuset), not the machine's count.

A server pinned to one core that sizes its thread pools by ``os.cpu_count()`` runs two onnxruntime threads on that
one core: a cross-encoder pair took 123 ms there instead of 113 on one thread (AMD EPYC, AVX2).
"""

from __future__ import annotations

import os


def usable() -> int:
    """The CPUs this process may run on, at least 1 (the machine's count where the platform has no affinity)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1
