"""Every setting the service reads, parsed once from the environment into one frozen object.

Only this module touches ``os.environ``. Names and defaults are docs/settings.md's (a test holds the two together);
a bad value stops start-up with a ``SettingsError`` naming the variable.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import urlsplit

from limits import parse_many

from textbook_chat.core.resources import Resources, current

T = TypeVar("T")

LogFormat = Literal["json", "text"]
EmbedderName = Literal["openai", "local"]
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names the variable (shown at start-up)."""


class Secret:
    """Holds a string that must not show up in reprs, logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    embedded_postgres: bool = True  # EMBEDDED_POSTGRES: with DATABASE_URL unset, serve runs a private Postgres
    redis_url: str | None = None
    redis_max_connections: int = 200  # REDIS_MAX_CONNECTIONS: per process and pool; a full pool waits briefly
    qdrant_url: str | None = None
    qdrant_api_key: Secret | None = None
    qdrant_path: Path = Path("./data/qdrant")
    qdrant_collection: str = "textbook"
    openai_api_key: Secret | None = None
    openai_base_url: str | None = None
    chat_model: str = "gpt-4o-mini"
    follow_up_rewrite: bool = False  # FOLLOW_UP_REWRITE: the model rewrites a follow-up that needs context
    follow_up_rewrite_s: float = 1.5  # FOLLOW_UP_REWRITE_S: how long that rewrite may take before the offline form
    embedder: EmbedderName = "local"
    embedding_model: str = "text-embedding-3-small"
    book_base_url: str = "http://localhost:3000"
    allowed_origins: tuple[str, ...] = ("http://localhost:3000",)
    rate_limit_anon: str = "10/hour"
    rate_limit_user: str = "50/hour"
    rate_limit_read: str = "120/minute"
    auth_jwt_secret: Secret | None = None
    auth_jwks_url: str | None = None
    auth_jwt_issuer: str | None = None  # AUTH_JWT_ISSUER: when set, a token's `iss` must be exactly this
    auth_jwt_audience: str | None = None  # AUTH_JWT_AUDIENCE: when set, a token's `aud` must name this
    auth_jwt_max_lifetime_days: float = 30.0  # AUTH_JWT_MAX_LIFETIME_DAYS: refuse tokens expiring further ahead
    admin_token: Secret | None = None  # ADMIN_TOKEN: opens GET /api/admin/report and /admin/report; unset = 404
    session_retention_days: int = 30
    faq_path: Path = Path("faq/faq.json")
    book_faq_path: Path | None = None  # BOOK_FAQ_PATH: the book's own FAQ entries (answer/faq.py)
    book_path: Path | None = None
    book_watch_s: float = 5.0  # serve --book: how often to look for a changed book (0: only on SIGHUP)
    llm_timeout_s: float = 20.0  # LLM_TIMEOUT_S: per read (connect, first byte, between two chunks)
    llm_max_answer_chars: int = 100_000  # LLM_MAX_ANSWER_CHARS: past this the model's answer ends as `length`
    llm_max_answer_s: float = 300.0  # LLM_MAX_ANSWER_S: the whole streamed answer; then it ends as `length`
    db_timeout_s: float = 2.0
    db_pool_size: int = 20  # DB_POOL_SIZE: connections per process
    db_queue_timeout_s: float = 10.0  # DB_QUEUE_TIMEOUT_S: how long a query waits for a free connection in a burst
    qdrant_timeout_s: float = 2.0
    data_dir: Path = Path("./data")
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    stream_grace_s: float = 20.0
    stream_ttl_s: float = 3600.0
    max_streams_per_client: int = 3
    session_daily_tokens: int = 50_000
    stream_signing_key: Secret | None = None
    llm_max_connections: int = 1000
    log_level: str = "info"
    log_format: LogFormat = "json"
    shutdown_grace_s: float = 20.0
    http_header_timeout_s: float = 15.0  # HTTP_HEADER_TIMEOUT_S: a request's headers must be whole within this
    http_body_timeout_s: float = 30.0  # HTTP_BODY_TIMEOUT_S: and its body within this after the headers
    http_max_pending_per_client: int | None = None  # HTTP_MAX_PENDING_PER_CLIENT: connections of one peer address
    # whose request is not whole yet (0: no cap; unset: sized from the open-file limit at start, at most 1,000);
    # open streams do not count, so 5,000 streams from one proxy still fit
    metrics_dir: Path | None = None  # PROMETHEUS_MULTIPROC_DIR: every process of one server writes its metrics here

    @property
    def llm_enabled(self) -> bool:
        return self.openai_api_key is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, resources: Resources | None = None) -> Settings:
        """The settings in ``environ`` (default: the process's); defaults for paths come from ``resources``
        (default: where this package runs from): a checkout keeps ``./data`` and its ``faq/``, the installed
        command a per-user data folder and the FAQ its wheel carries."""
        env = os.environ if environ is None else environ
        files = current() if resources is None else resources
        r = _Reader(env)
        openai_key = r.secret("OPENAI_API_KEY")
        settings = cls(
            database_url=r.url("DATABASE_URL", schemes=("postgresql", "postgres")),
            embedded_postgres=r.choice("EMBEDDED_POSTGRES", ("on", "off"), "on", lower=True) == "on",
            redis_url=r.url("REDIS_URL", schemes=("redis", "rediss", "unix")),
            redis_max_connections=r.number("REDIS_MAX_CONNECTIONS", int, cls.redis_max_connections, minimum=2),
            qdrant_url=r.url("QDRANT_URL", schemes=("http", "https")),
            qdrant_api_key=r.secret("QDRANT_API_KEY"),
            qdrant_path=r.path("QDRANT_PATH", cls.qdrant_path),
            qdrant_collection=r.text("QDRANT_COLLECTION", cls.qdrant_collection),
            openai_api_key=openai_key,
            openai_base_url=r.url("OPENAI_BASE_URL", schemes=("http", "https")),
            chat_model=r.text("CHAT_MODEL", cls.chat_model),
            follow_up_rewrite=r.choice("FOLLOW_UP_REWRITE", ("on", "off"), "off", lower=True) == "on",
            follow_up_rewrite_s=r.number("FOLLOW_UP_REWRITE_S", float, cls.follow_up_rewrite_s, minimum=0.001),
            embedder=r.choice("EMBEDDER", ("openai", "local"), "openai" if openai_key else "local"),  # type: ignore[arg-type]
            embedding_model=r.text("EMBEDDING_MODEL", cls.embedding_model),
            book_base_url=(r.url("BOOK_BASE_URL", schemes=("http", "https")) or cls.book_base_url).rstrip("/"),
            allowed_origins=r.csv("ALLOWED_ORIGINS", cls.allowed_origins),
            rate_limit_anon=r.rate("RATE_LIMIT_ANON", cls.rate_limit_anon),
            rate_limit_user=r.rate("RATE_LIMIT_USER", cls.rate_limit_user),
            rate_limit_read=r.rate("RATE_LIMIT_READ", cls.rate_limit_read),
            auth_jwt_secret=r.secret("AUTH_JWT_SECRET"),
            auth_jwks_url=r.url("AUTH_JWKS_URL", schemes=("http", "https")),
            auth_jwt_issuer=r.optional_text("AUTH_JWT_ISSUER"),
            auth_jwt_audience=r.optional_text("AUTH_JWT_AUDIENCE"),
            auth_jwt_max_lifetime_days=r.number(
                "AUTH_JWT_MAX_LIFETIME_DAYS", float, cls.auth_jwt_max_lifetime_days, minimum=0.001
            ),
            admin_token=r.secret("ADMIN_TOKEN"),
            session_retention_days=r.number("SESSION_RETENTION_DAYS", int, cls.session_retention_days, minimum=1),
            faq_path=r.path("FAQ_PATH", files.faq),
            book_faq_path=r.optional_path("BOOK_FAQ_PATH"),
            book_path=r.optional_path("BOOK_PATH"),
            book_watch_s=r.number("BOOK_WATCH_S", float, cls.book_watch_s, minimum=0.0),
            llm_timeout_s=r.number("LLM_TIMEOUT_S", float, cls.llm_timeout_s, minimum=0.001),
            llm_max_answer_chars=r.number("LLM_MAX_ANSWER_CHARS", int, cls.llm_max_answer_chars, minimum=100),
            llm_max_answer_s=r.number("LLM_MAX_ANSWER_S", float, cls.llm_max_answer_s, minimum=0.001),
            db_timeout_s=r.number("DB_TIMEOUT_S", float, cls.db_timeout_s, minimum=0.001),
            db_pool_size=r.number("DB_POOL_SIZE", int, cls.db_pool_size, minimum=2),
            db_queue_timeout_s=r.number("DB_QUEUE_TIMEOUT_S", float, cls.db_queue_timeout_s, minimum=0.001),
            qdrant_timeout_s=r.number("QDRANT_TIMEOUT_S", float, cls.qdrant_timeout_s, minimum=0.001),
            data_dir=r.path("DATA_DIR", files.default_data_dir),
            trusted_proxies=r.networks("TRUSTED_PROXIES"),
            stream_grace_s=r.number("STREAM_GRACE_S", float, cls.stream_grace_s, minimum=0),
            stream_ttl_s=r.number("STREAM_TTL_S", float, cls.stream_ttl_s, minimum=1),
            max_streams_per_client=r.number("MAX_STREAMS_PER_CLIENT", int, cls.max_streams_per_client, minimum=1),
            session_daily_tokens=r.number("SESSION_DAILY_TOKENS", int, cls.session_daily_tokens, minimum=1),
            stream_signing_key=r.secret("STREAM_SIGNING_KEY"),
            llm_max_connections=r.number("LLM_MAX_CONNECTIONS", int, cls.llm_max_connections, minimum=1),
            log_level=r.choice("LOG_LEVEL", _LOG_LEVELS, cls.log_level, lower=True),
            log_format=r.choice("LOG_FORMAT", ("json", "text"), cls.log_format, lower=True),  # type: ignore[arg-type]
            shutdown_grace_s=r.number("SHUTDOWN_GRACE_S", float, cls.shutdown_grace_s, minimum=0),
            http_header_timeout_s=r.number("HTTP_HEADER_TIMEOUT_S", float, cls.http_header_timeout_s, minimum=0.001),
            http_body_timeout_s=r.number("HTTP_BODY_TIMEOUT_S", float, cls.http_body_timeout_s, minimum=0.001),
            http_max_pending_per_client=r.number("HTTP_MAX_PENDING_PER_CLIENT", int, None, minimum=0),
            metrics_dir=r.optional_path("PROMETHEUS_MULTIPROC_DIR"),
        )
        if settings.admin_token is not None and len(settings.admin_token.reveal()) < 16:
            raise SettingsError("ADMIN_TOKEN is too short: use at least 16 random characters (openssl rand -hex 24)")
        if r.optional_path("QDRANT_PATH") is None:
            # The embedded index lives in DATA_DIR (wherever that is) unless QDRANT_PATH says otherwise.
            settings = settings.replace(qdrant_path=settings.data_dir / "qdrant")
        return settings

    def replace(self, **changes: object) -> Settings:
        from dataclasses import replace

        return replace(self, **changes)  # type: ignore[arg-type]


class _Reader:
    """Reads and converts one variable at a time, naming it in every error."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def _raw(self, key: str) -> str | None:
        value = self._env.get(key)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def _fail(self, key: str, value: str, why: str) -> SettingsError:
        shown = value if len(value) <= 80 else value[:77] + "..."
        return SettingsError(f"{key}={shown!r} is not valid: {why}")

    def text(self, key: str, default: str) -> str:
        return self._raw(key) or default

    def optional_text(self, key: str) -> str | None:
        return self._raw(key)

    def secret(self, key: str) -> Secret | None:
        value = self._raw(key)
        return Secret(value) if value is not None else None

    def path(self, key: str, default: Path) -> Path:
        value = self._raw(key)
        return Path(value) if value is not None else default

    def optional_path(self, key: str) -> Path | None:
        value = self._raw(key)
        return Path(value) if value is not None else None

    def number(self, key: str, kind: Callable[[str], T], default: T, *, minimum: float) -> T:
        value = self._raw(key)
        if value is None:
            return default
        try:
            parsed = kind(value)
        except ValueError:
            raise self._fail(key, value, f"expected {'an integer' if kind is int else 'a number'}") from None
        if parsed < minimum:  # type: ignore[operator]
            raise self._fail(key, value, f"must be at least {minimum:g}")
        return parsed

    def choice(self, key: str, options: tuple[str, ...], default: str, *, lower: bool = False) -> str:
        value = self._raw(key)
        if value is None:
            return default
        if lower:
            value = value.lower()
        if value not in options:
            raise self._fail(key, value, f"expected one of {', '.join(options)}")
        return value

    def url(self, key: str, *, schemes: tuple[str, ...]) -> str | None:
        value = self._raw(key)
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 -- raises ValueError on a non-numeric port
        except ValueError as exc:
            raise self._fail(key, value, str(exc)) from None
        scheme = parts.scheme.split("+", 1)[0]
        if scheme not in schemes:
            raise self._fail(key, value, f"expected a URL starting with {' or '.join(s + '://' for s in schemes)}")
        if scheme != "unix" and not parts.hostname:
            raise self._fail(key, value, "the URL has no host")
        return value

    def csv(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._raw(key)
        if value is None:
            return default
        items = tuple(item.strip().rstrip("/") for item in value.split(",") if item.strip())
        for item in items:
            if item != "*" and not urlsplit(item).netloc:
                raise self._fail(key, value, f"{item!r} is not an origin like https://book.example.org")
        return items

    def rate(self, key: str, default: str) -> str:
        value = self._raw(key)
        if value is None:
            return default
        try:
            parse_many(value)
        except ValueError:
            raise self._fail(key, value, "expected a rate such as '10/hour' or '5 per minute'") from None
        return value

    def networks(self, key: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        value = self._raw(key)
        if value is None:
            return ()
        try:
            return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in value.split(",") if item.strip())
        except ValueError as exc:
            raise self._fail(key, value, str(exc)) from None
