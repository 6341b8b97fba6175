"""Signed-in users: a JWT from the app's identity provider names the user who owns sessions.

With ``AGENT_JWT_SECRET`` a token signed with HS256/384/512 and that secret is accepted; with
``AGENT_JWKS_URL`` one signed with a key of that JSON Web Key Set (RS256/384/512, PS256/384/512,
ES256/384/512, EdDSA), the key picked by the token's ``kid``. The algorithm follows the key: a
token's ``alg`` must be one its key can make (an HMAC token is checked with the secret only, never
with a public key), and ``none`` is never accepted. ``exp`` and ``sub`` are required; ``iss``
and ``aud`` are checked when ``AGENT_JWT_ISSUER`` / ``AGENT_JWT_AUDIENCE`` are set; ``exp``,
``nbf`` and ``iat`` with ``AGENT_JWT_LEEWAY_S`` of leeway.

The key set is fetched at start, again hourly, and at once for a ``kid`` it does not hold (at most
once per 30 s, so tokens with made-up ids cannot make the service hammer the provider). A token
verified once is remembered until it expires, so a client that sends the same token on every
request costs one dictionary lookup after the first; a change of the key set forgets them all,
so a removed key's tokens stop working at the next fetch.

The user is ``sub`` scoped by ``iss``: two providers' users with the same ``sub`` are two owners.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt

from service import jsonsafe
from service.config import Settings

log = logging.getLogger(__name__)

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
# What each kind of key (a JWK's ``kty``) may sign with.
KEY_ALGORITHMS = {
    "RSA": frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}),
    "EC": frozenset({"ES256", "ES384", "ES512"}),
    "OKP": frozenset({"EdDSA"}),
}
REFETCH_UNKNOWN_S = 30.0  # the least time between two fetches for a kid not in the set
REFRESH_S = 3600.0  # how old the key set may grow before it is fetched again anyway
MAX_TOKEN_BYTES = 8192
CACHE_ENTRIES = 100_000
FETCH_TIMEOUT_S = 5.0


class TokenRefused(Exception):
    """A bearer token that does not name a user; the message says why (RFC 6750's
    ``error_description``), and nothing about any session."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is: its owner id, and when its credential expires (None: never)."""

    owner: str
    expires: float | None = None


def user_owner(issuer: str, subject: str) -> str:
    """The owner id of a user: ``sub`` scoped by its issuer, stable, saying nothing of either."""
    return "u" + hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()[:31]


class JwtVerifier:
    """Checks JWTs against the configured secret and key set; remembers those it accepted."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.secret = settings.jwt_secret
        self.jwks_url = settings.jwks_url
        self.issuer = settings.jwt_issuer or None
        self.audience = list(settings.jwt_audience) or None
        self.leeway = settings.jwt_leeway_s
        self.clock = clock
        self._keys: dict[str, tuple[jwt.PyJWK, str | None]] = {}  # kid -> (key, its own alg)
        self._fetched_at = float("-inf")
        self._fetch_lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        self._accepted: dict[str, Identity] = {}

    @property
    def enabled(self) -> bool:
        """True when a secret or a key set is configured."""
        return bool(self.secret or self.jwks_url)

    async def start(self) -> None:
        """Fetch the key set once (a provider that is down now is asked again when needed)."""
        if self.jwks_url:
            await self._fetch()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def verify(self, token: str) -> Identity:
        """The user ``token`` names; :class:`TokenRefused` saying why otherwise."""
        known = self._accepted.get(token)
        now = self.clock()
        if known is not None and known.expires is not None and known.expires + self.leeway > now:
            return known
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenRefused(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise TokenRefused("the token is not a well-formed JWT") from None
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm.lower() == "none":
            raise TokenRefused("unsigned tokens (alg none) are not accepted")
        key = await self._key_for(algorithm, header.get("kid"))
        claims = self._decode(token, key, algorithm)
        subject, issuer = claims.get("sub"), claims.get("iss", "")
        if not isinstance(subject, str) or not subject or not isinstance(issuer, str):
            raise TokenRefused("the token's sub (and iss, when given) must be non-empty strings")
        identity = Identity(user_owner(issuer, subject), float(claims["exp"]))
        if len(self._accepted) >= CACHE_ENTRIES:
            self._forget_expired(now)
        self._accepted[token] = identity
        return identity

    def _decode(self, token: str, key: Any, algorithm: str) -> dict[str, Any]:
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRefused("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRefused("the token is not valid yet (nbf or iat in the future)") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused("the token's issuer is not the one this service accepts") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("the token is for another audience") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("the token's signature does not verify") from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenRefused(f"the token has no {exc.claim} claim") from None
        except (jwt.InvalidTokenError, jwt.PyJWKError, ValueError, TypeError) as exc:
            raise TokenRefused(f"the token is not valid: {type(exc).__name__}") from None

    async def _key_for(self, algorithm: str, kid: Any) -> Any:
        if algorithm in HMAC_ALGORITHMS:
            if not self.secret:
                raise TokenRefused("HMAC-signed tokens are not accepted here (no shared secret)")
            return self.secret
        if not self.jwks_url:
            raise TokenRefused("tokens signed with a private key are not accepted here (no key set)")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused("the token names no key (kid)")
        held = self._keys.get(kid)
        age = self.clock() - self._fetched_at
        if (held is None and age >= REFETCH_UNKNOWN_S) or age >= REFRESH_S:
            await self._fetch()
            held = self._keys.get(kid)
        if held is None:
            raise TokenRefused("the key the token names (kid) is not in the key set")
        key, named = held
        if algorithm not in KEY_ALGORITHMS.get(str(key.key_type), ()) or named not in (None, algorithm):
            raise TokenRefused("the token's alg is not one its key signs with")
        return key.key

    async def _fetch(self) -> None:
        """Fetch the key set (one fetch at a time; a failed one keeps the keys held)."""
        async with self._fetch_lock:
            started = self.clock()
            if started - self._fetched_at < 1.0:
                return  # fetched just now by the request this one waited for
            self._fetched_at = started
            try:
                if self._http is None:
                    self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
                async with self._http.get(self.jwks_url) as response:
                    response.raise_for_status()
                    document = jsonsafe.loads(await response.read())
                keys = _signing_keys(document)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("the JWKS at %s could not be fetched: %s", self.jwks_url, exc)
                return
            if set(keys) != set(self._keys):
                self._accepted.clear()  # a removed key's tokens must not outlive it here
            self._keys = keys

    def _forget_expired(self, now: float) -> None:
        self._accepted = {
            token: identity
            for token, identity in self._accepted.items()
            if identity.expires is not None and identity.expires + self.leeway > now
        }
        while len(self._accepted) >= CACHE_ENTRIES:
            del self._accepted[next(iter(self._accepted))]


def _signing_keys(document: Any) -> dict[str, tuple[jwt.PyJWK, str | None]]:
    """The signing keys of a JWKS document by ``kid``; a key this service cannot use (no ``kid``,
    an encryption key, a kind PyJWT does not know) is passed over, as RFC 7517 §5 asks."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWK Set (no keys array)")
    keys: dict[str, tuple[jwt.PyJWK, str | None]] = {}
    for entry in document["keys"]:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("kid"), str)
            or entry.get("use", "sig") != "sig"
        ):
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
        named = entry.get("alg")
        keys[entry["kid"]] = (key, named if isinstance(named, str) else None)
    return keys
