"""The daemon's side of the local control API (:mod:`arceusd.base.control`: its framing and its client): serve
handlers on the unix socket of the state directory (mode 0600), one JSON line each way; a client that sends garbage
gets an error response, never a crash."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from arceusd.base.control import MAX_LINE, ControlError, Handler, RequestError, socket_alive
from arceusd.base.fdlimit import AcceptBackoff, accept

log = logging.getLogger(__name__)


async def serve_control(
    path: Path,
    handlers: Mapping[str, Handler],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handlers`` on the unix socket ``path`` until cancelled; removes the socket file on exit.

    A stale socket file (left by a crashed daemon) is replaced; a live one (another daemon answering) is an error.
    """
    if path.exists():
        if socket_alive(path):
            raise ControlError(f"another daemon is already listening on {path}; stop it or use another --state-dir")
        path.unlink()
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(64)
    listener = trio.SocketListener(sock)
    backoff = AcceptBackoff("control socket")  # out of descriptors: wait and accept again, never exit
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await accept(listener, backoff)
                nursery.start_soon(_serve_one, stream, handlers)
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def _serve_one(stream: trio.abc.Stream, handlers: Mapping[str, Handler]) -> None:
    async with stream:
        buf = bytearray()
        try:
            while b"\n" not in buf:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buf += chunk
                if len(buf) > MAX_LINE:
                    await _reply(stream, {"ok": False, "error": f"request longer than {MAX_LINE} bytes"})
                    return
            line = bytes(buf.split(b"\n", 1)[0])
            response = await _dispatch(line, handlers)
            await _reply(stream, response)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def _dispatch(line: bytes, handlers: Mapping[str, Handler]) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return {"ok": False, "error": "request is not valid JSON"}
    if not isinstance(request, dict) or not isinstance(request.get("method"), str):
        return {"ok": False, "error": "request must be an object with a string 'method'"}
    params = request.get("params", {})
    if not isinstance(params, dict):
        return {"ok": False, "error": "'params' must be an object"}
    handler = handlers.get(request["method"])
    if handler is None:
        return {"ok": False, "error": f"unknown method {request['method']!r}; known: {', '.join(sorted(handlers))}"}
    try:
        return {"ok": True, "result": await handler(params)}
    except RequestError as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a handler bug must not take the daemon down; it is logged with its traceback
        log.exception("control method %s failed", request["method"])
        return {"ok": False, "error": f"internal error in {request['method']}: {exc}"}


async def _reply(stream: trio.abc.Stream, response: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(response, default=str).encode() + b"\n")


__all__ = ["serve_control"]
