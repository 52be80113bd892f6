"""The doors of every MLflow server tfdist starts: which Host and Origin it answers, which features it opens.

MLflow 3.17's own checks let too much in for a server on a user's machine: any
``localhost:*`` page is an allowed origin (with credentials), any Host that starts
with ``10.`` or ``192.168.`` as text passes (DNS rebinding), and its AI assistant
(which runs Bash on the host for any loopback client), AI gateway (stored provider
keys) and job runner are mounted for anyone who reaches the port. This ASGI
middleware sits in front of all of it:

- a request whose ``Host`` is not one of the server's own names is refused (421);
- a request with an ``Origin`` that is not the server's own page (or one the
  operator named) is refused (403), whatever its method;
- the assistant, the gateway and the job runner answer 404 unless opened, and
  when opened only to a request that carries the owner's token (a cookie set by
  the address ``tfdist ui``/``server`` prints, or an ``X-Tfdist-Token`` header).

The CLI (:mod:`tfdist_cli.serving`) decides the policy and hands it over in the
environment, which only the server's owner can read (``/proc/PID/environ`` is 0400).
"""

from __future__ import annotations

import hmac
import json
import os
import posixpath
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode

HOSTS_ENV = "TFDIST_SERVER_HOSTS"
ORIGINS_ENV = "TFDIST_SERVER_ORIGINS"
OPEN_ENV = "TFDIST_SERVER_OPEN"
TOKEN_ENV = "TFDIST_SERVER_TOKEN"
TOKEN_COOKIE = "tfdist-token"
TOKEN_HEADER = b"x-tfdist-token"
TOKEN_QUERY = "tfdist_token"

#: What each feature that can be opened mounts (matched anywhere in the normalised path, so a static prefix
#: or a doubled slash does not slip past).
FEATURE_PATHS: dict[str, tuple[str, ...]] = {
    "assistant": ("/ajax-api/3.0/mlflow/assistant",),
    "gateway": ("/mlflow/gateway/", "/mlflow/scorer/invoke", "/mlflow/issues/invoke", "/gateway/"),
    "jobs": ("/ajax-api/3.0/jobs", "/mlflow/prompt-optimization/"),
}
FEATURES = tuple(FEATURE_PATHS)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class DoorPolicy:
    """What a server answers.

    Attributes:
        hosts: the ``Host`` header values it answers (``name:port``).
        origins: the ``Origin`` values it answers besides its own pages (``http://`` + each host).
        opened: features of :data:`FEATURE_PATHS` opened to the owner's token.
        token: the owner's token; empty when nothing is opened.
    """

    hosts: frozenset[str]
    origins: frozenset[str] = frozenset()
    opened: frozenset[str] = frozenset()
    token: str = ""

    def allowed_origins(self) -> frozenset[str]:
        own = {f"{scheme}://{host}" for host in self.hosts for scheme in ("http", "https")}
        return frozenset(own) | self.origins

    def to_env(self) -> dict[str, str]:
        return {HOSTS_ENV: json.dumps(sorted(self.hosts)), ORIGINS_ENV: json.dumps(sorted(self.origins)),
                OPEN_ENV: json.dumps(sorted(self.opened)), TOKEN_ENV: self.token}

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None) -> DoorPolicy:
        """The policy the CLI left in the environment; without one, loopback on MLflow's default port only."""
        env = os.environ if environ is None else environ
        hosts = json.loads(env.get(HOSTS_ENV) or "[]") or loopback_hosts(5000)
        return cls(hosts=frozenset(hosts), origins=frozenset(json.loads(env.get(ORIGINS_ENV) or "[]")),
                   opened=frozenset(json.loads(env.get(OPEN_ENV) or "[]")), token=env.get(TOKEN_ENV, ""))


def loopback_hosts(port: int) -> list[str]:
    """The names a browser or client on this machine uses for a loopback server on ``port``."""
    return with_port(("127.0.0.1", "localhost", "[::1]"), port)


def with_port(names: Iterable[str], port: int) -> list[str]:
    """``name:port`` for each name (and the bare name on port 80, as clients then send it)."""
    bracketed = [f"[{name}]" if ":" in name and not name.startswith("[") else name for name in names]
    return [f"{name}:{port}" for name in bracketed] + (bracketed if port == 80 else [])


def feature_of(path: str) -> str | None:
    """The closed-by-default feature a request path belongs to, if any."""
    normal = posixpath.normpath("/" + path.lstrip("/")) + ("/" if path.endswith("/") else "")
    for feature, markers in FEATURE_PATHS.items():
        if any(marker in normal or normal == marker.rstrip("/") for marker in markers):
            return feature
        if normal.startswith("/gateway") and feature == "gateway":
            return feature
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    for part in (_header(scope, b"cookie") or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class ServerDoors:
    """ASGI middleware enforcing a :class:`DoorPolicy` in front of MLflow's app."""

    def __init__(self, app: ASGIApp, policy: DoorPolicy) -> None:
        self.app = app
        self.policy = policy
        self.origins = policy.allowed_origins()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None and scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if refusal is not None:
            await _respond(send, *refusal)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        token = query.pop(TOKEN_QUERY, [""])[0]
        if token and self.policy.token and hmac.compare_digest(token, self.policy.token):
            await self.set_token_cookie(scope, send, query)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, reason) when the request may not pass, else None."""
        host = _header(scope, b"host")
        if host not in self.policy.hosts:
            return 421, f"this server does not answer to Host {host!r} (tfdist: --allowed-host adds a name)"
        origin = _header(scope, b"origin")
        if origin is not None and origin not in self.origins:
            return 403, f"requests from pages at {origin!r} are refused (tfdist: --cors-origin adds an origin)"
        feature = feature_of(scope.get("path", "/"))
        if feature is None:
            return None
        if feature not in self.policy.opened:
            return 404, f"MLflow's {feature} is off in tfdist's servers (tfdist ui --enable {feature} opens it)"
        presented = _cookie(scope, TOKEN_COOKIE) or _header(scope, TOKEN_HEADER) or ""
        if not (self.policy.token and hmac.compare_digest(presented, self.policy.token)):
            return 403, f"MLflow's {feature} answers only its owner: open the address the server printed"
        return None

    async def set_token_cookie(self, scope: Scope, send: Send, query: dict[str, list[str]]) -> None:
        """Answer the owner's address with the token as a cookie, and send the browser on to it without the token."""
        location = scope.get("path", "/") + (f"?{urlencode(query, doseq=True)}" if query else "")
        cookie = f"{TOKEN_COOKIE}={self.policy.token}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()),
                                (b"cache-control", b"no-store"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


async def _respond(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"error_code": "PERMISSION_DENIED", "message": reason}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


#: TensorBoard's profile plugin's "Capture profile": the server connects to any address asked and writes what it
#: gets into the served folder. tfdist captures with ``train.profile_steps``; this door stays shut.
TENSORBOARD_CAPTURE = "/data/plugin/profile/capture_profile"
_STATUS = {403: "403 Forbidden", 404: "404 Not Found", 421: "421 Misdirected Request"}


class WsgiDoors:
    """The same doors in front of a WSGI app (``tfdist tensorboard``'s TensorBoard), with its capture shut."""

    def __init__(self, app: Callable[..., Any], policy: DoorPolicy) -> None:
        self.app = app
        self.doors = ServerDoors(app, policy)  # only its refusal is used

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "/")
        headers = [(b"host", environ["HTTP_HOST"].encode("latin-1"))] if "HTTP_HOST" in environ else []
        if "HTTP_ORIGIN" in environ:
            headers.append((b"origin", environ["HTTP_ORIGIN"].encode("latin-1")))
        refusal = self.doors.refusal({"type": "http", "path": path, "headers": headers})
        if refusal is None and TENSORBOARD_CAPTURE in posixpath.normpath("/" + path.lstrip("/")):
            refusal = 404, "TensorBoard's capture is off in tfdist tensorboard: train.profile_steps captures a run"
        if refusal is None:
            return self.app(environ, start_response)
        body = json.dumps({"error_code": "PERMISSION_DENIED", "message": refusal[1]}).encode()
        start_response(_STATUS[refusal[0]], [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
