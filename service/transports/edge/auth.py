"""Access control: API keys, signed-in users, short-lived tokens, ownership, origins and CORS.

- With ``AGENT_API_KEYS``, ``AGENT_JWT_SECRET`` or ``AGENT_JWKS_URL`` set, every route but
  ``/healthz``, ``/openapi.json``, the static page and the protected-resource metadata needs a
  credential: ``Authorization: Bearer <key or token>`` for scripts; ``?token=`` or the cookie
  for ``EventSource`` and ``WebSocket``, which cannot set headers.
- A request's *owner* is a fingerprint of its key, or the user a JWT names (``sub`` scoped by
  ``iss``, see :mod:`service.transports.edge.identity`). Sessions remember their owner; anyone
  else gets 404, so a session's existence does not leak.
- ``POST /auth/token`` trades a key for a short-lived token, for the key itself or, with
  ``{"sub": "alice"}``, for one user of the app that holds the key (an owner scoped by that key):
  an app without an identity provider hands each person a token of their own. Tokens are
  stateless: the payload (key owner, user, expiry) is signed with the key, so any instance that
  knows the keys can check them, and dropping a key revokes its tokens.
- A credential that expires bounds the streams opened with it: they end at its expiry
  (:data:`EXPIRES_KEY`), and the client comes back with a fresh one.
- ``AGENT_ALLOWED_ORIGINS``: browsers' cross-origin requests and WebSocket handshakes from other
  origins are refused with 403; allowed origins get CORS headers and preflight answers.
- ``AGENT_ALLOWED_HOSTS``: a request whose ``Host`` names another host is refused with 403
  (``/healthz`` aside). A page on a rebinding domain (``evil.example`` resolving to 127.0.0.1)
  sends its own origin and host, which look same-origin; its Host name gives it away.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from service import jsonsafe
from service.config import Settings, host_name
from service.transports.edge.identity import Identity, JwtVerifier, TokenRefused, user_owner

OWNER_KEY = web.RequestKey("owner", str)
# When the request's credential expires (epoch seconds; absent for an API key).
EXPIRES_KEY = web.RequestKey("credential_expires", float)
METADATA_PATH = "/.well-known/oauth-protected-resource"
TOKEN_COOKIE = "agentstream_token"
PUBLIC_PATHS = frozenset({"/", "/healthz", "/favicon.ico", "/openapi.json"})
PUBLIC_PREFIXES = ("/static/", METADATA_PATH)
# What a page on an allowed origin may send: the AI SDK, AG-UI and OpenAI clients send JSON with
# a Bearer key; EventSource's reconnect sends Last-Event-ID; MCP's Streamable HTTP names its
# session and protocol version in headers of its own.
CORS_HEADERS = "Authorization, Content-Type, Accept, Last-Event-ID, Mcp-Session-Id, Mcp-Protocol-Version"
CORS_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
# What such a page's script may read of a reply: a 429's or 503's wait, the AI SDK's stream
# marker, the MCP session's id, why a token was refused.
CORS_EXPOSE = "Retry-After, x-vercel-ai-ui-message-stream, Mcp-Session-Id, WWW-Authenticate"
ANONYMOUS = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def fingerprint(key: str) -> str:
    """The owner id of a key: stable, and says nothing about the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class Authenticator:
    """Checks keys, the service's own tokens and JWTs; issues tokens."""

    def __init__(
        self, keys: list[str], token_ttl_s: float = 3600.0, verifier: JwtVerifier | None = None
    ) -> None:
        self._keys = {fingerprint(key): key for key in keys}
        self.token_ttl_s = token_ttl_s
        self.verifier = verifier

    @property
    def enabled(self) -> bool:
        """True when keys or an identity provider are configured."""
        return bool(self._keys) or self.jwt

    @property
    def jwt(self) -> bool:
        """True when JWTs of signed-in users are accepted."""
        return self.verifier is not None and self.verifier.enabled

    @property
    def keys(self) -> bool:
        """True when API keys are configured."""
        return bool(self._keys)

    def owner_of_key(self, candidate: str) -> str | None:
        """The owner id if ``candidate`` is one of the keys."""
        if not candidate.isascii() and not _encodable(candidate):
            return None  # a header's bytes that are not UTF-8: no key of ours
        owner = fingerprint(candidate)
        key = self._keys.get(owner)
        if key is not None and hmac.compare_digest(key.encode(), candidate.encode()):
            return owner
        return None

    def issue_token(
        self, owner: str, now: float | None = None, subject: str | None = None
    ) -> tuple[str, float]:
        """A token for ``owner`` (or for the user ``subject`` of that key) and when it expires."""
        expires = (time.time() if now is None else now) + self.token_ttl_s
        claims: dict[str, object] = {"o": owner, "e": round(expires)}
        if subject is not None:
            claims["s"] = subject
        payload = _b64(jsonsafe.dumps(claims).encode())
        signature = hmac.new(self._keys[owner].encode(), payload.encode(), hashlib.sha256).digest()
        return f"{payload}.{_b64(signature)}", float(round(expires))

    def identity_of_token(self, token: str, now: float | None = None) -> Identity | None:
        """Who a token of this service's own names, if it is well signed and not expired."""
        payload, _, signature = token.partition(".")
        try:
            claims = jsonsafe.loads(_unb64(payload))
            owner, expires = claims["o"], float(claims["e"])
            subject = claims.get("s")
            given = _unb64(signature)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        key = self._keys.get(owner) if isinstance(owner, str) else None
        if key is None or expires < (time.time() if now is None else now):
            return None
        expected = hmac.new(key.encode(), payload.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, given):
            return None
        if isinstance(subject, str) and subject:
            owner = user_owner(f"key:{owner}", subject)
        return Identity(owner, expires)

    def owner_of_token(self, token: str, now: float | None = None) -> str | None:
        """The owner id a token of this service's own names (see :meth:`identity_of_token`)."""
        identity = self.identity_of_token(token, now)
        return None if identity is None else identity.owner

    async def authenticate(self, request: web.Request) -> Identity | None:
        """Who the request is, or None when it carries no credential this service accepts;
        :class:`TokenRefused` (why) for a JWT that does not verify."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            credential = value.strip()
        else:
            credential = request.query.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
            if not credential:
                return None
        jwt_shaped = credential.count(".") == 2  # a JWT; this service's own tokens have one dot
        if self._keys:
            owner = self.owner_of_key(credential)
            if owner is not None:
                return Identity(owner)
            identity = None if jwt_shaped else self.identity_of_token(credential)
            if identity is not None:
                return identity
        if self.verifier is not None and self.verifier.enabled:
            return await self.verifier.verify(credential)
        return None


AUTH_KEY = web.AppKey("authenticator", Authenticator)
HOSTS_KEY = web.AppKey("allowed_hosts", frozenset | None)
SETTINGS_KEY = web.AppKey("auth_settings", Settings)


def _is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def same_origin(request: web.Request, origin: str) -> bool:
    """True when ``origin`` names this very host and port (what a same-site page sends)."""
    parts = urlsplit(origin)
    return bool(parts.netloc) and parts.netloc.lower() == (request.host or "").lower()


def origin_allowed(request: web.Request, settings: Settings) -> bool:
    """No Origin (not a browser), the same origin, or one listed in AGENT_ALLOWED_ORIGINS."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return (
        same_origin(request, origin) or origin in settings.allowed_origins or "*" in settings.allowed_origins
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def cors_headers(request: web.Request) -> dict[str, str] | None:
    """The CORS headers a reply to ``request`` carries: None unless it comes from another
    origin that AGENT_ALLOWED_ORIGINS lets in."""
    origin = request.headers.get("Origin")
    if origin is None or same_origin(request, origin):
        return None
    if not origin_allowed(request, request.app[SETTINGS_KEY]):
        return None
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Credentials": "true",
        "Access-Control-Expose-Headers": CORS_EXPOSE,
    }


async def add_cors(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every reply to an allowed origin carries its CORS headers.

    Added as the headers go out rather than after a handler returns, because most replies here
    are streams whose headers leave inside the handler, and errors are answered by middlewares
    outside this one (admission, errors): one place sees them all, streamed or not, success or
    error, preflight or not.
    """
    if "Origin" not in request.headers:
        return  # scripts and same-page requests without an Origin: nothing to add
    cors = cors_headers(request)
    if cors is None:
        return
    headers = response.headers
    headers.update(cors)
    vary = headers.get("Vary")
    if vary is None:
        headers["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        headers["Vary"] = f"{vary}, Origin"


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Origins first (a preflight answered here), then keys; sets the request's owner for the
    handlers. The CORS headers of every reply are added by :func:`add_cors`."""
    settings = request.app[SETTINGS_KEY]
    hosts = request.app[HOSTS_KEY]
    host = request.headers.get("Host")
    # No Host at all is no browser's request (every browser sends one), so nothing to rebind.
    if hosts is not None and host is not None and host_name(host) not in hosts and request.path != "/healthz":
        return _json_error(403, f"host {host_name(host)!r} is not allowed; see AGENT_ALLOWED_HOSTS")
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin(request, origin):
        if not origin_allowed(request, settings):
            if request.path == "/healthz":
                return await handler(request)
            return _json_error(403, f"origin {origin} is not allowed")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": CORS_METHODS,
                    "Access-Control-Allow-Headers": CORS_HEADERS,
                    "Access-Control-Max-Age": "600",
                },
            )
    auth = request.app[AUTH_KEY]
    if not auth.enabled or _is_public(request.path):
        request[OWNER_KEY] = ANONYMOUS
        return await handler(request)
    try:
        identity = await auth.authenticate(request)
    except TokenRefused as exc:
        # RFC 6750 §3: why, in the challenge; never who else there is.
        challenge = f'Bearer error="invalid_token", error_description="{exc}"'
        return _json_error(401, str(exc), {"WWW-Authenticate": _with_metadata(request, auth, challenge)})
    if identity is None:
        message = "missing or invalid API key" if auth.keys else "missing or invalid token"
        return _json_error(401, message, {"WWW-Authenticate": _with_metadata(request, auth, "Bearer")})
    request[OWNER_KEY] = identity.owner
    if identity.expires is not None:
        request[EXPIRES_KEY] = identity.expires
    return await handler(request)


def _with_metadata(request: web.Request, auth: Authenticator, challenge: str) -> str:
    """MCP's clients learn where to sign in from the protected-resource metadata (RFC 9728)
    that a refusal on ``/mcp`` names, when users sign in with JWTs."""
    if not auth.jwt or not request.path.startswith("/mcp"):
        return challenge
    separator = " " if challenge == "Bearer" else ", "
    return f'{challenge}{separator}resource_metadata="{base_url(request)}{METADATA_PATH}"'


def base_url(request: web.Request) -> str:
    """This service's origin as the request reached it."""
    return f"{request.scheme}://{request.host}"


async def resource_metadata(request: web.Request) -> web.Response:
    """``GET /.well-known/oauth-protected-resource``: RFC 9728's metadata, naming the issuer of
    the tokens this service accepts as its authorization server (404 without JWT sign-in)."""
    settings = request.app[SETTINGS_KEY]
    if not (settings.jwt_secret or settings.jwks_url):
        return _json_error(
            404, "users do not sign in with tokens here (no AGENT_JWKS_URL or AGENT_JWT_SECRET)"
        )
    document: dict[str, object] = {
        "resource": f"{base_url(request)}/mcp",
        "bearer_methods_supported": ["header"],
        "resource_name": "agentstream",
    }
    if settings.jwt_issuer:
        document["authorization_servers"] = [settings.jwt_issuer]
    return web.json_response(document, dumps=jsonsafe.dumps)


TOKEN_EXPIRED = "the token expired: reconnect with a fresh one and resume from the last id seen"


def at_expiry(request: web.Request, callback: Callable[[], None]) -> asyncio.TimerHandle | None:
    """Call ``callback`` when the request's credential expires (None: a key, which does not): a
    stream opened with a token ends there, every transport the same way."""
    expires = request.get(EXPIRES_KEY)
    if expires is None:
        return None
    return asyncio.get_running_loop().call_later(max(0.0, expires - time.time()), callback)


def owner_of(request: web.Request) -> str:
    """The owner id the access middleware found ("" when keys are off)."""
    return request.get(OWNER_KEY, ANONYMOUS)


def setup(app: web.Application, settings: Settings) -> None:
    """Install the access middleware's state and the protected-resource metadata."""
    verifier = JwtVerifier(settings) if settings.jwt_secret or settings.jwks_url else None
    app[AUTH_KEY] = Authenticator(settings.api_keys, settings.token_ttl_s, verifier)
    app[SETTINGS_KEY] = settings
    app[HOSTS_KEY] = settings.allowed_host_names()
    if settings.allowed_origins:
        app.on_response_prepare.append(add_cors)
    if verifier is not None:

        async def keys(app: web.Application) -> Any:
            await verifier.start()
            yield
            await verifier.close()

        app.cleanup_ctx.append(keys)
    app.router.add_get(METADATA_PATH, resource_metadata)
    app.router.add_get(f"{METADATA_PATH}/mcp", resource_metadata)
