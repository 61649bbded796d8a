"""Who is asking: the user id (``sub``) of a verified ``Authorization: Bearer`` JWT, or None (anonymous).

HS256 with ``AUTH_JWT_SECRET``, or the auth provider's keys from ``AUTH_JWKS_URL`` (fetched with a
timeout, cached). A token that is present but expired, forged or malformed, issued by or for someone else
(``AUTH_JWT_ISSUER`` / ``AUTH_JWT_AUDIENCE``), or expiring further ahead than ``AUTH_JWT_MAX_LIFETIME_DAYS`` is a
401, never a silent downgrade to anonymous.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from textbook_chat.core.errors import Unauthorized
from textbook_chat.core.settings import Settings

if TYPE_CHECKING:
    import jwt

log = logging.getLogger(__name__)

JWKS_CACHE_S = 300
LEEWAY_S = 30
_ASYMMETRIC = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self._secret = settings.auth_jwt_secret.reveal() if settings.auth_jwt_secret else None
        self._issuer = settings.auth_jwt_issuer
        self._audience = settings.auth_jwt_audience
        self._max_lifetime_s = settings.auth_jwt_max_lifetime_days * 86400
        self._jwks: jwt.PyJWKClient | None = None
        if settings.auth_jwks_url:
            import jwt  # here and in _verify: a server without sign-in never loads PyJWT and its cryptography

            self._jwks = jwt.PyJWKClient(
                settings.auth_jwks_url,
                cache_keys=True,
                lifespan=JWKS_CACHE_S,
                timeout=int(max(1, settings.db_timeout_s)),
            )

    @property
    def enabled(self) -> bool:
        return self._secret is not None or self._jwks is not None

    async def user_id(self, authorization: str | None) -> str | None:
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Send the token as 'Authorization: Bearer <token>'.", code="invalid_token")
        if not self.enabled:
            raise Unauthorized("Sign-in is not enabled on this server; ask without a token.", code="auth_disabled")
        claims = await self._verify(token.strip())
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject or len(subject) > 200 or not subject.isprintable():
            raise Unauthorized("The token has no usable subject ('sub').", code="invalid_token")
        return subject

    async def _verify(self, token: str) -> dict[str, Any]:
        import jwt

        required = ["sub", "exp", *(["iss"] if self._issuer else []), *(["aud"] if self._audience else [])]
        # With AUTH_JWT_ISSUER / AUTH_JWT_AUDIENCE unset, PyJWT still refuses a token naming an audience.
        checks: dict[str, Any] = {"leeway": LEEWAY_S, "issuer": self._issuer, "audience": self._audience}
        try:
            if self._jwks is not None:
                # PyJWKClient fetches with urllib (blocking): keep it off the event loop.
                key = await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)
                claims: dict[str, Any] = jwt.decode(
                    token, key.key, algorithms=_ASYMMETRIC, options={"require": required}, **checks
                )
            else:
                assert self._secret is not None
                claims = jwt.decode(token, self._secret, algorithms=["HS256"], options={"require": required}, **checks)
        except jwt.ExpiredSignatureError:
            raise Unauthorized("The sign-in token has expired; sign in again.", code="token_expired") from None
        except jwt.PyJWKClientError as exc:
            log.warning("JWKS lookup failed: %s", exc)
            raise Unauthorized("The sign-in token could not be verified.", code="invalid_token") from None
        except (jwt.InvalidIssuerError, jwt.InvalidAudienceError):
            raise Unauthorized("The sign-in token was not issued for this server.", code="invalid_token") from None
        except jwt.InvalidTokenError:
            raise Unauthorized("The sign-in token is not valid.", code="invalid_token") from None
        # PyJWT takes a numeric string for a time (it calls int() on it); RFC 7519 says a number, and so do we.
        for name in ("exp", "nbf", "iat"):
            value = claims.get(name)
            if (value is not None or name == "exp") and (type(value) not in (int, float) or value != value):
                raise Unauthorized(f"The sign-in token's '{name}' is not a number.", code="invalid_token")
        # A token valid for centuries is a leaked credential that cannot be revoked: AUTH_JWT_MAX_LIFETIME_DAYS.
        if claims["exp"] - time.time() > self._max_lifetime_s + LEEWAY_S:
            raise Unauthorized("The sign-in token expires too far ahead; sign in again.", code="invalid_token")
        return claims
