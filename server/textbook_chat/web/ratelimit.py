"""Rate limits (``limits``, moving window) and the client address they are keyed on.

Questions cost ``RATE_LIMIT_ANON`` per client address or ``RATE_LIMIT_USER`` per signed-in user; reads
have ``RATE_LIMIT_READ``. Storage is Redis when configured (shared by every worker), else memory; if Redis
fails mid-run the limits carry on in memory with a logged warning and go back to Redis later, so a limit
never turns into a 500. Headers follow the IETF RateLimit draft plus ``Retry-After`` on a 429.

A question is let in by ``admit``, in one call from the handler: a stream slot (``MAX_STREAMS_PER_CLIENT``),
then one unit of the ask budget.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from limits import RateLimitItem, parse
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string

from textbook_chat.core import metrics
from textbook_chat.core.errors import RateLimited
from textbook_chat.core.settings import Settings

if TYPE_CHECKING:
    from redis.asyncio import BlockingConnectionPool

log = logging.getLogger(__name__)

Kind = Literal["ask", "read"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
REDIS_RETRY_S = 30.0  # after a Redis failure, memory serves for this long before Redis is tried again


@dataclass(frozen=True)
class Budget:
    limit: int
    remaining: int
    reset_s: int

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset_s),
        }


class RateLimiter:
    def __init__(self, settings: Settings, *, prefix: str = "tc") -> None:
        self._items: dict[str, RateLimitItem] = {
            "anon": parse(settings.rate_limit_anon),
            "user": parse(settings.rate_limit_user),
            "read": parse(settings.rate_limit_read),
        }
        self._prefix = prefix
        self._memory = MovingWindowRateLimiter(storage_from_string("async+memory://"))
        self._redis: MovingWindowRateLimiter | None = None
        self._pool: BlockingConnectionPool | None = None
        if settings.redis_url:
            from redis.asyncio import BlockingConnectionPool  # only with Redis: without it redis-py stays unloaded

            # Our own pool, so ``aclose`` can release its sockets (limits has no close of its own).
            self._pool = BlockingConnectionPool.from_url(
                settings.redis_url,
                max_connections=settings.redis_max_connections,
                timeout=settings.db_timeout_s,  # a full pool waits for a connection rather than failing open
                socket_timeout=settings.db_timeout_s,
                socket_connect_timeout=settings.db_timeout_s,
            )
            options: dict[str, Any] = {"implementation": "redispy", "connection_pool": self._pool}
            storage = storage_from_string("async+" + settings.redis_url, **options)  # typed str-only options
            self._redis = MovingWindowRateLimiter(storage)
        self._redis_down_until = 0.0

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()

    async def hit(self, kind: Kind, *, client: str, user_id: str | None) -> Budget:
        """Spend one unit of ``kind`` for this caller; raises ``RateLimited`` (429) when none is left."""
        name, key = self._bucket(kind, client, user_id)
        item = self._items[name]
        allowed, reset_at, remaining = await self._hit(item, name, key)
        reset_s = max(1, math.ceil(reset_at - time.time()))
        budget = Budget(item.amount, max(0, remaining), reset_s)
        if not allowed:
            metrics.RATE_LIMITED.labels(name).inc()
            what = "questions" if kind == "ask" else "requests"
            raise RateLimited(
                f"Too many {what}: {item.amount} per {_window(item)}. Try again in {_human(reset_s)}.",
                retry_after=reset_s,
                headers=budget.headers(),
            )
        return budget

    async def peek(self, kind: Kind, *, client: str, user_id: str | None) -> Budget:
        """What ``hit`` would report, without spending anything (for the headers of another refusal)."""
        name, key = self._bucket(kind, client, user_id)
        item = self._items[name]
        limiter = (
            self._redis if self._redis is not None and time.monotonic() >= self._redis_down_until else self._memory
        )
        try:
            stats = await limiter.get_window_stats(item, self._prefix, name, key)
        except Exception:  # noqa: BLE001 -- headers are best effort
            stats = await self._memory.get_window_stats(item, self._prefix, name, key)
        return Budget(item.amount, max(0, stats.remaining), max(1, math.ceil(stats.reset_time - time.time())))

    def _bucket(self, kind: Kind, client: str, user_id: str | None) -> tuple[str, str]:
        if kind == "read":
            return "read", f"user:{user_id}" if user_id else f"ip:{client}"
        if user_id:
            return "user", f"user:{user_id}"
        return "anon", f"ip:{client}"

    async def _hit(self, item: RateLimitItem, name: str, key: str) -> tuple[bool, float, int]:
        limiter = self._memory
        if self._redis is not None and time.monotonic() >= self._redis_down_until:
            limiter = self._redis
        try:
            allowed = await limiter.hit(item, self._prefix, name, key)
            stats = await limiter.get_window_stats(item, self._prefix, name, key)
        except Exception as exc:  # noqa: BLE001 -- any storage failure: fall back, never 500
            if limiter is self._memory:
                raise
            log.warning(
                "rate-limit storage failed (%s); limiting in memory for %.0f s", type(exc).__name__, REDIS_RETRY_S
            )
            self._redis_down_until = time.monotonic() + REDIS_RETRY_S
            return await self._hit(item, name, key)
        return allowed, stats.reset_time, stats.remaining


def caller_key(client: str, user_id: str | None) -> str:
    """The identity a caller's stream slots are counted under: the signed-in user, else the client address."""
    return f"user:{user_id}" if user_id else f"ip:{client}"


def client_address(peer: str | None, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """Who the client is, for limits: the socket peer, or, when the peer is a trusted proxy, the nearest
    untrusted address it forwarded; then one key per person, not per address (``client_key``).

    ``X-Forwarded-For`` is read right to left and only through trusted hops, so a client cannot mint new
    budgets by sending its own header. ``forwarded_for`` must hold every ``X-Forwarded-For`` line of the
    request joined with commas, in order (a proxy such as HAProxy appends its own line after the client's).
    """
    address = peer or "unknown"
    if trusted and forwarded_for and _is_trusted(address, trusted):
        for part in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
            hop = _hop_address(part)
            if hop is None:
                break
            address = hop
            if not _is_trusted(hop, trusted):
                break
    return client_key(address)


def client_key(address: str) -> str:
    """One key per client: an IPv4-mapped IPv6 address is its IPv4 address, and an IPv6 client is its /64
    (one home or one device's privacy addresses: it can pick any address inside it at will)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _is_trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def _hop_address(hop: str) -> str | None:
    """The address of one ``X-Forwarded-For`` entry, with the port some proxies append (``9.9.9.9:80``,
    ``[2001:db8::1]:443``) dropped: otherwise every client would share the proxy's budget, or each port mint
    its own (issue 25). None when it is not an address."""
    if _valid_ip(hop):
        return hop
    if hop.startswith("["):
        host, bracket, rest = hop[1:].partition("]")
        port = rest.removeprefix(":")
        ok = bracket and (rest == "" or (rest.startswith(":") and _is_port(port)))
        return host if ok and _valid_ip(host) and ":" in host else None
    host, colon, port = hop.rpartition(":")
    return host if colon and ":" not in host and _is_port(port) and _valid_ip(host) else None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5


def _valid_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _window(item: RateLimitItem) -> str:
    unit: Any = item.GRANULARITY.name
    return unit if item.multiples == 1 else f"{item.multiples} {unit}s"


def _human(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 3600)} h"


class StreamSlots:
    """At most ``MAX_STREAMS_PER_CLIENT`` generations at once per caller, across workers when Redis is set.

    With Redis, a sorted set per caller holds its live message ids, each scored with an expiry so a
    crashed worker's slots free themselves; without it (or while Redis fails) a per-process count serves.
    """

    def __init__(self, limit: int, redis: Any | None, *, slot_ttl_s: float = 600.0) -> None:
        self.limit = limit
        self._redis = redis
        self._slot_ttl_s = slot_ttl_s
        self._local: dict[str, set[str]] = {}

    async def acquire(self, key: str, message_id: str) -> None:
        """Take a slot for ``message_id``; raises ``RateLimited`` when the caller already has ``limit``."""
        if self._redis is not None:
            try:
                taken = await self._acquire_redis(key, message_id)
            except Exception as exc:  # noqa: BLE001 -- Redis trouble must not block questions
                log.warning("stream slots unavailable in Redis (%s); counting in this process", type(exc).__name__)
            else:
                if not taken:
                    raise self._busy()
                return
        live = self._local.setdefault(key, set())
        if len(live) >= self.limit:
            raise self._busy()
        live.add(message_id)

    async def release(self, key: str, message_id: str) -> None:
        live = self._local.get(key)
        if live is not None:
            live.discard(message_id)
            if not live:
                del self._local[key]
        if self._redis is not None:
            try:
                await self._redis.zrem(f"tc:slots:{key}", message_id)
            except Exception as exc:  # noqa: BLE001 -- the slot expires by itself
                log.warning("stream slot not released in Redis (%s)", type(exc).__name__)

    async def _acquire_redis(self, key: str, message_id: str) -> bool:
        # Add first, then count: two racing requests can only both be refused, never both let through.
        now = time.time()
        name = f"tc:slots:{key}"
        redis = self._redis
        assert redis is not None
        async with redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(name, "-inf", now)
            pipe.zadd(name, {message_id: now + self._slot_ttl_s})
            pipe.expire(name, int(self._slot_ttl_s))
            pipe.zcard(name)
            *_, count = await pipe.execute()
        if int(count) > self.limit:
            await redis.zrem(name, message_id)
            return False
        return True

    def _busy(self) -> RateLimited:
        metrics.RATE_LIMITED.labels("streams").inc()
        return RateLimited(
            f"You already have {self.limit} answers in progress; wait for one to finish.",
            retry_after=5,
            code="too_many_streams",
        )


class Admission:
    """A question let in: the ask budget's headers for its response, and the stream slot it holds."""

    def __init__(self, slots: StreamSlots | None, key: str, slot: str) -> None:
        self.headers: dict[str, str] = {}
        self.kept = False
        self._slots = slots
        self._key = key
        self._slot = slot
        self._released = False

    def keep(self) -> None:
        """The slot now belongs to the answer's run, which gives it back (``release``) when it ends."""
        self.kept = True

    async def release(self) -> None:
        """Give the slot back; once is enough, and a second call does nothing."""
        if self._released:
            return
        self._released = True
        if self._slots is not None:
            await self._slots.release(self._key, self._slot)


@asynccontextmanager
async def admit(
    limiter: RateLimiter | None, slots: StreamSlots | None, *, client: str, user_id: str | None
) -> AsyncIterator[Admission]:
    """Let a question in, or refuse it with 429: first a stream slot, so a question refused for too many open
    answers costs nothing (its 429 carries the ask budget as it stands); then one unit of the ask budget, and
    a question refused for that gives its slot back. Leaving the block gives the slot back too, unless
    ``Admission.keep`` handed it to the answer's run (a question attached to an earlier answer, or one that
    failed to start, generates nothing)."""
    key, slot = caller_key(client, user_id), uuid.uuid4().hex
    if slots is not None:
        try:
            await slots.acquire(key, slot)
        except RateLimited as busy:
            if limiter is not None:
                budget = await limiter.peek("ask", client=client, user_id=user_id)
                busy.headers = {**budget.headers(), **busy.headers}
            raise
    admission = Admission(slots, key, slot)
    try:
        if limiter is not None:
            admission.headers = (await limiter.hit("ask", client=client, user_id=user_id)).headers()
        yield admission
    finally:
        if not admission.kept:
            await admission.release()
