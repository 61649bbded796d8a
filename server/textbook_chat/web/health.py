"""``GET /health``: probes every dependency at once, each within a short deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal

from textbook_chat import __version__
from textbook_chat.web.services import Services

ServiceStatus = Literal["ok", "down", "disabled", "offline", "migrations_pending"]
PROBE_TIMEOUT_S = 0.5  # the whole check answers well under a second even when everything hangs


async def check(services: Services) -> dict[str, object]:
    probes: dict[str, Callable[[], Awaitable[ServiceStatus]]] = {
        "postgres": lambda: _postgres(services),
        "redis": lambda: _redis(services),
        "qdrant": lambda: _qdrant(services),
        "llm": lambda: _llm(services),
    }
    results = await asyncio.gather(*(_bounded(probe) for probe in probes.values()))
    statuses = dict(zip(probes, results, strict=True))
    degraded = any(status in ("down", "migrations_pending") for status in statuses.values())
    return {"status": "degraded" if degraded else "ok", "services": statuses, "version": __version__}


async def _bounded(probe: Callable[[], Awaitable[ServiceStatus]]) -> ServiceStatus:
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return await probe()
    except Exception:  # noqa: BLE001 -- any failure of a probe means "down", never a 500
        return "down"


async def _postgres(services: Services) -> ServiceStatus:
    if services.store is None:
        return "disabled"
    if not await services.store.ping(PROBE_TIMEOUT_S):
        return "down"
    # Reachable but never migrated: every question would need tables that are not there (issue 25).
    return "migrations_pending" if await services.store.schema_pending(PROBE_TIMEOUT_S) else "ok"


async def _redis(services: Services) -> ServiceStatus:
    if services.redis is None:
        return "disabled"
    return "ok" if await services.redis.ping() else "down"


async def _qdrant(services: Services) -> ServiceStatus:
    if services.index is None:
        return "disabled"
    await services.index.exists()  # raises RetrievalUnavailable when the server is unreachable
    return "ok"


async def _llm(services: Services) -> ServiceStatus:
    # Without a key the offline generator answers: a working mode, not a failure.
    return "offline" if not services.settings.llm_enabled else "ok"
