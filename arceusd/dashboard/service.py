"""The daemon side of the dashboard: the ``dashboard`` control method and the web server's lifetime.

The server starts on the first ``dashboard`` call (``arceusd dashboard``), not with the daemon: a daemon nobody
watches pays nothing for it. It runs in this service's nursery on the daemon's trio loop (hypercorn's trio
worker), on ``dashboard_host:dashboard_port`` from the config (127.0.0.1 and a free port by default), behind a
token drawn from ``secrets`` when the daemon starts. The method answers the URL, host and port; the ``dashboard``
status section shows whether it runs and its port, never the token.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import trio

from arceusd.base.control import RequestError
from arceusd.dashboard.data import NodeSnapshots, keep_reading
from arceusd.device.node import Node

log = logging.getLogger(__name__)


class Dashboard:
    """The web server's state: not started, or serving on ``port``."""

    def __init__(self, node: Node, nursery: trio.Nursery) -> None:
        self.node = node
        self.nursery = nursery
        self.token = secrets.token_urlsafe(24)
        self.port: int | None = None
        self.lock = trio.Lock()

    @property
    def host(self) -> str:
        return self.node.config.dashboard_host

    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else shown
        return f"http://{shown}:{self.port}/{self.token}/"

    async def ensure(self) -> None:
        async with self.lock:
            if self.port is not None:
                return
            from hypercorn.config import Config  # hypercorn: started lazily
            from hypercorn.trio import serve  # hypercorn

            from arceusd.dashboard.app import build_app  # starlette: started lazily

            config = Config()
            host = f"[{self.host}]" if ":" in self.host else self.host
            config.bind = [f"{host}:{self.node.config.dashboard_port}"]
            config.accesslog = None
            config.errorlog = logging.getLogger("arceusd.dashboard.http")
            config.graceful_timeout = 1.0
            snapshots = NodeSnapshots(self.node)
            app = build_app(snapshots, self.token)
            try:
                binds: list[str] = await self.nursery.start(_serve, serve, app, config)
            except (OSError, BaseExceptionGroup) as exc:
                error = _first(exc, OSError)
                if error is None:
                    raise
                raise RequestError(
                    f"cannot serve the dashboard on {host}:{self.node.config.dashboard_port}: "
                    f"{error.strerror or error}; set dashboard_port in config.toml to a free port"
                ) from None
            self.port = int(binds[0].rsplit(":", 1)[1])
            self.nursery.start_soon(keep_reading, snapshots)  # the device page's CPU and memory, its prices
            if self.host not in ("127.0.0.1", "::1", "localhost"):
                log.warning("the dashboard is served to the network on %s (dashboard_host in config.toml)", binds[0])
            log.info("dashboard serving on %s", binds[0])

    def summary(self) -> dict[str, Any]:
        return {"running": self.port is not None, "host": self.host, "port": self.port}


def _first(exc: BaseException, kind: type[OSError]) -> OSError | None:
    """The first ``kind`` in ``exc`` (itself, or a leaf of an exception group)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None


async def _serve(serve: Any, app: Any, config: Any, *, task_status: trio.TaskStatus[list[str]]) -> None:
    await serve(app, config, task_status=task_status)


async def serve_dashboard(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Register the ``dashboard`` method; serve pages once it is first called, until the daemon stops."""
    async with trio.open_nursery() as nursery:
        dashboard = Dashboard(node, nursery)

        async def m_dashboard(_params: dict[str, Any]) -> dict[str, Any]:
            await dashboard.ensure()
            return {"url": dashboard.url(), **dashboard.summary()}

        node.methods["dashboard"] = m_dashboard
        node.sections["dashboard"] = dashboard.summary
        task_status.started()
        await trio.sleep_forever()


__all__ = ["Dashboard", "serve_dashboard"]
