"""Access control: API keys, short-lived browser tokens, session ownership, origins and CORS.

- With ``AGENT_API_KEYS`` set, every route but ``/healthz``, ``/openapi.json`` and the static
  page needs a key: ``Authorization: Bearer <key>`` for scripts. Browsers can't set headers
  on ``EventSource`` or ``WebSocket``, so ``POST /auth/token`` trades a key for a short-lived
  signed token, accepted as ``?token=``, as a cookie, or as a Bearer value.
- A request's *owner* is a fingerprint of its key. Sessions remember their owner; any other
  key gets 404, so a session's existence does not leak.
- Tokens are stateless: the payload (owner, expiry) is signed with the owner's own key, so any
  instance that knows the keys can check them, and dropping a key revokes its tokens.
- ``AGENT_ALLOWED_ORIGINS``: browsers' cross-origin requests and WebSocket handshakes from other
  origins are refused with 403; allowed origins get CORS headers and preflight answers.
- ``AGENT_ALLOWED_HOSTS``: a request whose ``Host`` names another host is refused with 403
  (``/healthz`` aside). A page on a rebinding domain (``evil.example`` resolving to 127.0.0.1)
  sends its own origin and host, which look same-origin; its Host name gives it away.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from service import jsonsafe
from service.config import Settings, host_name

OWNER_KEY = web.RequestKey("owner", str)
TOKEN_COOKIE = "agentstream_token"
PUBLIC_PATHS = frozenset({"/", "/healthz", "/favicon.ico", "/openapi.json"})
PUBLIC_PREFIXES = ("/static/",)
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
    """Checks keys and tokens; issues tokens."""

    def __init__(self, keys: list[str], token_ttl_s: float = 3600.0) -> None:
        self._keys = {fingerprint(key): key for key in keys}
        self.token_ttl_s = token_ttl_s

    @property
    def enabled(self) -> bool:
        """True when keys are configured."""
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

    def issue_token(self, owner: str, now: float | None = None) -> tuple[str, float]:
        """A token for ``owner`` and when it expires (epoch seconds)."""
        expires = (time.time() if now is None else now) + self.token_ttl_s
        payload = _b64(json.dumps({"o": owner, "e": round(expires)}, separators=(",", ":")).encode())
        signature = hmac.new(self._keys[owner].encode(), payload.encode(), hashlib.sha256).digest()
        return f"{payload}.{_b64(signature)}", float(round(expires))

    def owner_of_token(self, token: str, now: float | None = None) -> str | None:
        """The owner id if ``token`` is well signed and not expired."""
        payload, _, signature = token.partition(".")
        try:
            claims = jsonsafe.loads(_unb64(payload))
            owner, expires = claims["o"], float(claims["e"])
            given = _unb64(signature)
        except (ValueError, KeyError, TypeError):
            return None
        key = self._keys.get(owner) if isinstance(owner, str) else None
        if key is None or expires < (time.time() if now is None else now):
            return None
        expected = hmac.new(key.encode(), payload.encode(), hashlib.sha256).digest()
        return owner if hmac.compare_digest(expected, given) else None

    def authenticate(self, request: web.Request) -> str | None:
        """The request's owner, or None when it carries no valid key or token."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            value = value.strip()
            return self.owner_of_key(value) or self.owner_of_token(value)
        token = request.query.get("token") or request.cookies.get(TOKEN_COOKIE)
        return self.owner_of_token(token) if token else None


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
    else:
        owner = auth.authenticate(request)
        if owner is None:
            return _json_error(401, "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
        request[OWNER_KEY] = owner
    return await handler(request)


async def issue_token(request: web.Request) -> web.Response:
    """``POST /auth/token``: trade a key (Bearer) for a short-lived token, also set as a cookie."""
    auth = request.app[AUTH_KEY]
    if not auth.enabled:
        return _json_error(404, "no API keys are configured, so no token is needed")
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    owner = auth.owner_of_key(value.strip()) if scheme.lower() == "bearer" else None
    if owner is None:
        return _json_error(401, "a token is issued for an API key only", {"WWW-Authenticate": "Bearer"})
    token, expires = auth.issue_token(owner)
    response = web.json_response({"token": token, "expires_at": expires})
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        max_age=int(auth.token_ttl_s),
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        path="/",
    )
    return response


def owner_of(request: web.Request) -> str:
    """The owner id the access middleware found ("" when keys are off)."""
    return request.get(OWNER_KEY, ANONYMOUS)


def setup(app: web.Application, settings: Settings) -> None:
    """Install the access middleware's state and the token route."""
    app[AUTH_KEY] = Authenticator(settings.api_keys, settings.token_ttl_s)
    app[SETTINGS_KEY] = settings
    app[HOSTS_KEY] = settings.allowed_host_names()
    if settings.allowed_origins:
        app.on_response_prepare.append(add_cors)
    app.router.add_post("/auth/token", issue_token)
