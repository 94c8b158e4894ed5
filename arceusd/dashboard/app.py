"""The dashboard's web app (starlette, served by hypercorn on the daemon's trio loop).

Every path starts with the per-run token (``/<token>/...``); any other path is refused with 403 before routing, the
token compared in constant time. Under it:

- pages ``/`` (the swarm), ``/job/<id>``, ``/owner``, ``/market``: one small HTML shell each; ``static/app.js``
  draws them (DOM text nodes and SVG elements only, never HTML from data: every string may be a stranger's);
- ``api/<view>`` answers the view's JSON now (``api/job/<id>?points=N`` bounds the loss history to N points);
- ``events/<view>`` streams the same JSON as server-sent events whenever it changes (checked every
  :data:`TICK_S` for a job, :data:`SLOW_TICK_S` for the rest), with a comment line every :data:`KEEPALIVE_S`
  so proxies and the browser keep the stream;
- ``job/<id>/loss.csv``: the job's whole loss history as CSV (``step,time,loss,val``, :func:`~arceusd.dashboard.
  data.loss_csv`);
- ``POST policy`` (``key=TERM&value=VALUE``, the device page's form): changes one lending term through
  ``arceusd policy --set``'s own code (:func:`arceusd.market.policy_file.change_policy`). Only from a page of
  this dashboard: a POST whose ``Origin`` (else ``Referer``) is not this server's own origin is refused with 403
  (:func:`origin_refusal`), so another site open in the same browser cannot change the terms even if it
  learned the token; a bad value is refused with 400 and one line saying what was wrong, and changes nothing.

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
from urllib.parse import urlsplit

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from arceusd.dashboard.data import (
    MAX_POINTS,
    Snapshots,
    Timelines,
    job_view,
    loss_csv,
    market_view,
    term_form,
)

TICK_S = 0.25
"""How often a job's stream checks for a change (a new step reaches the page within this and a frame)."""
SLOW_TICK_S = 1.0
"""The same for the other views (their status changes every tick: uptimes, last heard)."""
KEEPALIVE_S = 15.0
PAGES = {"swarm": "The swarm", "job": "Job", "owner": "This device", "market": "The market"}
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
MAX_FORM_BYTES = 2048
"""The largest body the device page's form may POST."""
LOOPBACK = ("127.0.0.1", "::1", "localhost")
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


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def own_origins(server: tuple[str, int] | None) -> set[str]:
    """The origins a page of this dashboard has: ``http://`` the address the request came in on (its local
    end, ``scope["server"]``), and on loopback each loopback name with that port."""
    if not server:
        return set()
    host, port = server
    names = LOOPBACK if host in LOOPBACK else (host,)
    return {f"http://{_host(name)}:{port}" for name in names}


def origin_refusal(origin: str | None, referer: str | None, server: tuple[str, int] | None) -> str | None:
    """Why a POST is not from a page of this dashboard (None: it is): its ``Origin`` header, else the origin of
    its ``Referer``, must be one of :func:`own_origins`."""
    claimed = origin
    if not claimed and referer:
        parts = urlsplit(referer)
        claimed = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None
    if not claimed:
        return "this request names no origin (Origin or Referer); change terms from the dashboard's own page"
    if claimed.lower() not in own_origins(server):
        return (
            f"requests from {claimed[:80]} may not change this device's terms; use the page `arceusd dashboard` prints"
        )
    return None


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
            await PlainTextResponse(
                "403: this dashboard needs the URL `arceusd dashboard` prints (with its token)",
                status_code=403,
                headers=SECURITY_HEADERS,
            )(scope, receive, send)
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
        body = (
            shell.replace("{{base}}", html.escape(f"/{token}/"))
            .replace("{{page}}", kind)
            .replace("{{title}}", html.escape(PAGES[kind]))
            .replace("{{job}}", html.escape(job_id))
        )
        return Response(
            body, media_type="text/html; charset=utf-8", headers={**SECURITY_HEADERS, "cache-control": "no-store"}
        )

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
        return {"market": market_view(await snapshots.market()), "jobs": (await snapshots.status()).get("jobs", [])}

    async def owner_data() -> dict[str, Any]:
        status = await snapshots.status()
        me = status.get("peer_id")
        contributions = []
        for summary in status.get("jobs", []) or []:
            job = await snapshots.job(str(summary.get("job_id", "")))
            for c in (job or {}).get("contributions", []) or []:
                if c.get("peer_id") == me:
                    contributions.append(
                        {
                            "job_id": summary.get("job_id"),
                            "name": summary.get("name"),
                            "state": summary.get("state"),
                            **c,
                        }
                    )
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
        return Response(
            _dumps(data), media_type="application/json", headers={**SECURITY_HEADERS, "cache-control": "no-store"}
        )

    async def events(request: Request) -> Response:
        view = views(request)
        if view is None:
            return PlainTextResponse("no such view", status_code=404)
        tick = TICK_S if request.path_params["view"] == "job" else SLOW_TICK_S
        return StreamingResponse(
            _stream(view, tick),
            media_type="text/event-stream",
            headers={**SECURITY_HEADERS, "cache-control": "no-store"},
        )

    async def csv(request: Request) -> Response:
        job = await snapshots.job(request.path_params["job_id"])
        if job is None:
            return PlainTextResponse("no such job", status_code=404, headers=SECURITY_HEADERS)
        name = "".join(c for c in str(job.get("job_id", ""))[:12] if c in "0123456789abcdef") or "job"
        return Response(
            loss_csv(job, timelines.observe(job)),
            media_type="text/csv; charset=utf-8",
            headers={
                **SECURITY_HEADERS,
                "cache-control": "no-store",
                "content-disposition": f'attachment; filename="loss-{name}.csv"',
            },
        )

    async def set_term(request: Request) -> Response:
        def answer(code: int, line: str) -> Response:
            return PlainTextResponse(line, status_code=code, headers={**SECURITY_HEADERS, "cache-control": "no-store"})

        server = request.scope.get("server")
        refusal = origin_refusal(
            request.headers.get("origin"),
            request.headers.get("referer"),
            (str(server[0]), int(server[1])) if server else None,
        )
        if refusal is not None:
            return answer(403, f"403: {refusal}")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return answer(413, f"the form may send at most {MAX_FORM_BYTES} bytes")
        try:
            key, value = term_form(body)
            await snapshots.set_term(key, value)
        except ValueError as exc:  # PolicyError is a ValueError: the policy's own message
            return answer(400, f"{str(exc).splitlines()[0] if str(exc) else 'bad value'}; nothing was changed")
        return answer(200, f"saved: policy.{key} = {value}")

    routes = [
        Route("/", swarm_page),
        Route("/job/{job_id}", job_page),
        Route("/job/{job_id}/loss.csv", csv),
        Route("/owner", owner_page),
        Route("/market", market_page),
        Route("/static/{name}", asset),
        Route("/api/{view}", api),
        Route("/events/{view}", events),
        Route("/policy", set_term, methods=["POST"]),
    ]
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


__all__ = ["KEEPALIVE_S", "SLOW_TICK_S", "TICK_S", "TokenGate", "build_app", "origin_refusal", "own_origins"]
