"""Who is asking: HS256 tokens with a shared secret, or an auth provider's keys from a JWKS URL.

The JWKS endpoint is a real HTTP server in the test; keys are made fresh for each run.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from jwt.algorithms import RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.servers import serving
from textbook_chat.core.errors import Unauthorized
from textbook_chat.core.settings import Settings
from textbook_chat.web.auth import Authenticator

SECRET = "auth-test-secret-long-enough-for-hs256-signing"


def _claims(sub: str = "alice", expires_in: int = 600) -> dict[str, Any]:
    return {"sub": sub, "exp": int(time.time()) + expires_in}


def _hs256(**claims: Any) -> str:
    return jwt.encode(_claims(**claims), SECRET, algorithm="HS256")


async def test_no_header_is_anonymous_and_a_valid_hs256_token_is_its_subject() -> None:
    auth = Authenticator(Settings.from_env({"AUTH_JWT_SECRET": SECRET}))
    assert await auth.user_id(None) is None
    assert await auth.user_id(f"Bearer {_hs256(sub='alice')}") == "alice"


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (f"Bearer {jwt.encode(_claims(expires_in=-3600), SECRET, algorithm='HS256')}", "token_expired"),
        (
            f"Bearer {jwt.encode(_claims(), 'another-secret-of-sufficient-length-xx', algorithm='HS256')}",
            "invalid_token",
        ),
        ("Bearer not.a.jwt", "invalid_token"),
        ("Basic YWxpY2U6cHc=", "invalid_token"),
        (f"Bearer {jwt.encode({'exp': int(time.time()) + 60}, SECRET, algorithm='HS256')}", "invalid_token"),
    ],
    ids=["expired", "forged", "malformed", "not-bearer", "no-subject"],
)
async def test_a_bad_token_is_a_401_never_an_anonymous_downgrade(header: str, code: str) -> None:
    auth = Authenticator(Settings.from_env({"AUTH_JWT_SECRET": SECRET}))
    with pytest.raises(Unauthorized) as refused:
        await auth.user_id(header)
    assert refused.value.status == 401 and refused.value.code == code


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": str(int(time.time()) + 600)},  # a numeric string: PyJWT accepts it, arithmetic on it was a 500
        {"exp": [int(time.time()) + 600]},
        {"exp": int(time.time()) + 600, "nbf": "0"},
        {"exp": int(time.time()) + 600, "iat": str(int(time.time()))},
    ],
    ids=["exp-string", "exp-list", "nbf-string", "iat-string"],
)
async def test_a_time_claim_that_is_not_a_number_is_a_401(claims: dict[str, Any]) -> None:
    auth = Authenticator(Settings.from_env({"AUTH_JWT_SECRET": SECRET}))
    token = jwt.encode({"sub": "alice", **claims}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthorized) as refused:
        await auth.user_id(f"Bearer {token}")
    assert refused.value.status == 401


def _signed(**claims: Any) -> str:
    return "Bearer " + jwt.encode({**_claims(), **claims}, SECRET, algorithm="HS256")


async def test_a_token_expiring_further_ahead_than_the_maximum_lifetime_is_refused() -> None:
    default = Authenticator(Settings.from_env({"AUTH_JWT_SECRET": SECRET}))
    year_30000 = 885_000_000_000  # seconds since 1970: the attack run's token
    for header in (_signed(exp=year_30000), _signed(exp=int(time.time()) + 31 * 86400)):
        with pytest.raises(Unauthorized) as refused:
            await default.user_id(header)
        assert refused.value.code == "invalid_token"
    assert await default.user_id(f"Bearer {_hs256(expires_in=29 * 86400)}") == "alice"
    one_day = Authenticator(Settings.from_env({"AUTH_JWT_SECRET": SECRET, "AUTH_JWT_MAX_LIFETIME_DAYS": "1"}))
    with pytest.raises(Unauthorized):
        await one_day.user_id(f"Bearer {_hs256(expires_in=2 * 86400)}")


async def test_with_an_issuer_and_audience_set_only_tokens_naming_them_are_accepted() -> None:
    env = {"AUTH_JWT_SECRET": SECRET, "AUTH_JWT_ISSUER": "https://auth.example", "AUTH_JWT_AUDIENCE": "textbook"}
    auth = Authenticator(Settings.from_env(env))
    assert await auth.user_id(_signed(iss="https://auth.example", aud="textbook")) == "alice"
    assert await auth.user_id(_signed(iss="https://auth.example", aud=["other", "textbook"])) == "alice"
    for claims in ({"iss": "https://evil.example", "aud": "textbook"}, {"aud": "textbook"}, {"iss": "https://auth.example"},
                   {"iss": "https://auth.example", "aud": "another-app"}):  # fmt: skip
        with pytest.raises(Unauthorized) as refused:
            await auth.user_id(_signed(**claims))
        assert refused.value.code == "invalid_token", claims
    # Without them set, any issuer is accepted (as before), and a token naming an audience is not.
    plain = Authenticator(Settings.from_env({"AUTH_JWT_SECRET": SECRET}))
    assert await plain.user_id(_signed(iss="https://anyone.example")) == "alice"
    with pytest.raises(Unauthorized):
        await plain.user_id(_signed(aud="textbook"))


async def test_a_token_sent_to_a_server_without_sign_in_is_refused_not_ignored() -> None:
    with pytest.raises(Unauthorized) as refused:
        await Authenticator(Settings.from_env({})).user_id(f"Bearer {_hs256()}")
    assert refused.value.code == "auth_disabled"


class Provider:
    """An auth provider: signs RS256 tokens and publishes its public key as a JWKS document."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "test-key-1"
        self.fetches = 0
        self.up = True

    def token(self, **claims: Any) -> str:
        return jwt.encode(_claims(**claims), self.key, algorithm="RS256", headers={"kid": self.kid})

    def app(self) -> Starlette:
        async def jwks(request: Request) -> JSONResponse:
            self.fetches += 1
            if not self.up:
                return JSONResponse({"error": "down"}, status_code=503)
            public = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
            return JSONResponse({"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]})

        return Starlette(routes=[Route("/.well-known/jwks.json", jwks)])


@pytest.fixture
async def provider() -> AsyncIterator[tuple[Provider, Authenticator]]:
    issuer = Provider()
    async with serving(issuer.app()) as url:
        settings = Settings.from_env({"AUTH_JWKS_URL": f"{url}/.well-known/jwks.json"})
        yield issuer, Authenticator(settings)


async def test_jwks_tokens_are_verified_with_the_providers_keys_fetched_once(
    provider: tuple[Provider, Authenticator],
) -> None:
    issuer, auth = provider
    for user in ("alice", "bob", "alice"):
        assert await auth.user_id(f"Bearer {issuer.token(sub=user)}") == user
    assert issuer.fetches == 1  # cached


def _hs256_signed_with_public_key(issuer: Provider) -> str:
    """The classic algorithm-confusion forgery: HS256 keyed with the provider's public PEM."""
    pem = issuer.key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": issuer.kid}
    signing_input = b".".join(_b64(json.dumps(part).encode()) for part in (header, _claims()))
    return (signing_input + b"." + _b64(hmac.new(pem, signing_input, hashlib.sha256).digest())).decode()


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


async def test_jwks_refuses_other_keys_expired_tokens_and_algorithm_confusion(
    provider: tuple[Provider, Authenticator],
) -> None:
    issuer, auth = provider
    impostor = Provider()  # the same kid, another key
    for token, code in (
        (impostor.token(), "invalid_token"),
        (issuer.token(expires_in=-3600), "token_expired"),
        (_hs256_signed_with_public_key(issuer), "invalid_token"),
    ):
        with pytest.raises(Unauthorized) as refused:
            await auth.user_id(f"Bearer {token}")
        assert refused.value.code == code


async def test_an_unreachable_jwks_is_a_401_not_a_500(provider: tuple[Provider, Authenticator]) -> None:
    issuer, auth = provider
    issuer.up = False
    with pytest.raises(Unauthorized):
        await auth.user_id(f"Bearer {issuer.token()}")


@pytest.mark.slow
def test_a_server_without_sign_in_never_loads_pyjwt() -> None:
    # PyJWT pulls in cryptography (11 MB of the server's memory) and is only needed to verify a token.
    code = "import sys, textbook_chat.web.app, textbook_chat.cli; sys.exit('jwt' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
