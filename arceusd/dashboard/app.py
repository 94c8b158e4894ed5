"""The dashboard's web app (starlette, served by hypercorn on the daemon's trio loop).

Every path starts with the per-run token (``/<token>/...``); any other path is refused with 403 before routing, the
token compared in constant time. Under it:

- pages ``/`` (the swarm), ``/job/<id>``, ``/owner``, ``/market``: one small HTML shell each; ``static/app.js``
  draws them (DOM text nodes and SVG elements only, never HTML from data: every string may be a stranger's);
- ``api/<view>`` answers the view's JSON now (``api/job/<id>?points=N`` bounds the loss history to N points);
- ``events/<view>`` streams the same JSON as server-sent events whenever it changes (checked every
  :data:`TICK_S` for a job, :data:`SLOW_TICK_S` for the rest), with a comment line every :data:`KEEPALIVE_S`
  so proxies and the browser keep the stream.

Handlers only await the snapshot provider (in-process, no I/O but the earnings file read in a thread), so the
daemon's loop stays responsive. Headers: a strict Content-Security-Policy (only this origin), no referrer (the
token is in the URL), no caching of data.
"""

from __future__ import annotations

import hmac
import html
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from arceusd.dashboard.data import MAX_POINTS, Snapshots, Timelines, job_view

TICK_S = 0.25
"""How often a job's stream checks for a change (a new step reaches the page within this and a frame)."""
SLOW_TICK_S = 1.0
"""The same for the other views (their status changes every tick: uptimes, last heard)."""
KEEPALIVE_S = 15.0
PAGES = {"swarm": "The swarm", "job": "Job", "owner": "This device", "market": "The market"}
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".svg": "image/svg+xml"}  # fmt: skip
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'self'; form-action 'none'; frame-ancestors 'none'",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}


def _static_files() -> dict[str, bytes]:
    """Every asset the pages use, read once from the package (nothing comes from another host)."""
    root = resources.files("arceusd.dashboard") / "static"
    return {e.name: e.read_bytes() for e in root.iterdir() if e.name.endswith((".js", ".css", ".svg", ".html"))}


class TokenGate:
    """ASGI middleware: only ``/<token>/...`` passes (the token stripped from the path); everything else is 403."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.prefix = f"/{token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        head, sep, rest = path[1:].partition("/")
        if not hmac.compare_digest(f"/{head}".encode(), self.prefix):
            await PlainTextResponse("403: this dashboard needs the URL `arceusd dashboard` prints (with its token)",
                                    status_code=403, headers=SECURITY_HEADERS)(scope, receive, send)  # fmt: skip
            return
        if not sep:  # /<token> without the slash: the pages' relative links need it
            await Response(status_code=307, headers={"location": f"/{head}/"})(scope, receive, send)
            return
        inner = dict(scope)
        inner["path"] = "/" + rest
        inner["raw_path"] = inner["path"].encode()
        await self.app(inner, receive, send)


def build_app(snapshots: Snapshots, token: str) -> ASGIApp:
    """The dashboard for ``snapshots``, behind ``token``."""
    static = _static_files()
    shell = static["page.html"].decode()
    timelines = Timelines()

    def page(kind: str, job_id: str = "") -> Response:
        body = (shell.replace("{{base}}", html.escape(f"/{token}/"))
                .replace("{{page}}", kind).replace("{{title}}", html.escape(PAGES[kind]))
                .replace("{{job}}", html.escape(job_id)))  # fmt: skip
        return Response(body, media_type="text/html; charset=utf-8",
                        headers={**SECURITY_HEADERS, "cache-control": "no-store"})  # fmt: skip

    async def swarm_page(_request: Request) -> Response:
        return page("swarm")

    async def job_page(request: Request) -> Response:
        return page("job", request.path_params["job_id"])

    async def owner_page(_request: Request) -> Response:
        return page("owner")

    async def market_page(_request: Request) -> Response:
        return page("market")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        body = static.get(name)
        kind = next((t for ext, t in STATIC_TYPES.items() if name.endswith(ext)), None)
        if body is None or kind is None:
            return PlainTextResponse("not found", status_code=404)
        return Response(body, media_type=kind, headers={**SECURITY_HEADERS, "cache-control": "max-age=3600"})

    async def job_data(job_id: str, points: int = MAX_POINTS) -> dict[str, Any] | None:
        job = await snapshots.job(job_id)
        if job is None:
            return None
        return job_view(job, timelines.observe(job), points)

    async def swarm_data() -> dict[str, Any]:
        return await snapshots.status()

    async def market_data() -> dict[str, Any]:
        return {"market": await snapshots.market(), "jobs": (await snapshots.status()).get("jobs", [])}

    async def owner_data() -> dict[str, Any]:
        status = await snapshots.status()
        me = status.get("peer_id")
        contributions = []
        for summary in status.get("jobs", []) or []:
            job = await snapshots.job(str(summary.get("job_id", "")))
            for c in (job or {}).get("contributions", []) or []:
                if c.get("peer_id") == me:
                    contributions.append({"job_id": summary.get("job_id"), "name": summary.get("name"),
                                          "state": summary.get("state"), **c})  # fmt: skip
        return {**await snapshots.owner(), "contributions": contributions}

    def views(request: Request) -> Callable[[], Awaitable[dict[str, Any] | None]] | None:
        kind = request.path_params["view"]
        if kind == "job":
            job_id = request.query_params.get("id", "")
            try:
                points = min(20_000, max(10, int(request.query_params.get("points", MAX_POINTS))))
            except ValueError:
                points = MAX_POINTS
            return lambda: job_data(job_id, points)
        return {"swarm": swarm_data, "market": market_data, "owner": owner_data}.get(kind)

    async def api(request: Request) -> Response:
        view = views(request)
        if view is None:
            return JSONResponse({"error": "no such view"}, status_code=404, headers=SECURITY_HEADERS)
        data = await view()
        if data is None:
            return JSONResponse({"error": "no such job"}, status_code=404, headers=SECURITY_HEADERS)
        return Response(_dumps(data), media_type="application/json",
                        headers={**SECURITY_HEADERS, "cache-control": "no-store"})  # fmt: skip

    async def events(request: Request) -> Response:
        view = views(request)
        if view is None:
            return PlainTextResponse("no such view", status_code=404)
        tick = TICK_S if request.path_params["view"] == "job" else SLOW_TICK_S
        return StreamingResponse(_stream(view, tick), media_type="text/event-stream",
                                 headers={**SECURITY_HEADERS, "cache-control": "no-store"})  # fmt: skip

    routes = [
        Route("/", swarm_page), Route("/job/{job_id}", job_page), Route("/owner", owner_page),
        Route("/market", market_page), Route("/static/{name}", asset), Route("/api/{view}", api),
        Route("/events/{view}", events),
    ]  # fmt: skip
    return TokenGate(Starlette(routes=routes), token)


def _dumps(data: Any) -> bytes:
    # allow_nan=False would fail on a diverged loss; NaN and infinities become null instead
    return json.dumps(_finite(data), separators=(",", ":"), default=str).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


async def _stream(view: Callable[[], Awaitable[dict[str, Any] | None]], tick: float) -> AsyncIterator[bytes]:
    """The view as server-sent events: the first answer at once, then each change; a keepalive when quiet."""
    last = b""
    quiet = 0.0
    while True:
        data = await view()
        body = _dumps(data) if data is not None else b'{"error":"gone"}'
        if body != last:
            last, quiet = body, 0.0
            yield b"data: " + body + b"\n\n"
        elif quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield b": keepalive\n\n"
        await trio.sleep(tick)
        quiet += tick


__all__ = ["KEEPALIVE_S", "SLOW_TICK_S", "TICK_S", "TokenGate", "build_app"]
