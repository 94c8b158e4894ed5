"""The local control API: the CLI talks to its own daemon over a unix socket in the state directory (mode 0600).

Framing: one JSON object per line each way. Request ``{"method": str, "params": {...}}``; response
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": str}``. Lines are capped (:data:`MAX_LINE`); a client
that sends garbage gets an error response, never a crash. The socket is only reachable by the daemon's user
(directory 0700, socket 0600), which is the whole authorisation story for local control.

The server side is trio (:func:`serve_control`); the client side is plain blocking sockets
(:func:`call`), so the CLI never needs an event loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from arceusd.base.fdlimit import AcceptBackoff, accept

log = logging.getLogger(__name__)

MAX_LINE = 1 << 20
Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ControlError(Exception):
    """A control call failed: no daemon, or the daemon answered with an error (the message says which)."""


class NoDaemon(ControlError):
    """No daemon is listening on the control socket."""


class RequestError(Exception):
    """Raised by handlers for a bad request; its message goes back to the CLI as is."""


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
        if _socket_alive(path):
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


def _socket_alive(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


def daemon_answers(path: Path) -> bool:
    """Whether a daemon listens on the control socket ``path`` (a connect, at most a second; nothing is asked)."""
    return path.exists() and _socket_alive(path)


def call(path: Path, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """Call ``method`` on the daemon whose control socket is ``path`` (blocking).

    Error handling: :class:`NoDaemon` when nothing listens there; :class:`ControlError` with the daemon's message
    when the call fails.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(str(path))
        except (FileNotFoundError, NotADirectoryError, ConnectionRefusedError):  # no such socket: nobody runs
            raise NoDaemon(f"no daemon is running for state directory {path.parent}") from None
        s.sendall(json.dumps({"method": method, "params": params or {}}).encode() + b"\n")
        buf = bytearray()
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ControlError("the daemon closed the connection without answering")
            buf += chunk
            if len(buf) > 64 * MAX_LINE:
                raise ControlError("the daemon's answer is too large")
    except TimeoutError:
        raise ControlError(f"the daemon did not answer {method!r} within {timeout:.0f} s") from None
    finally:
        s.close()
    response = json.loads(bytes(buf.split(b"\n", 1)[0]))
    if not response.get("ok"):
        raise ControlError(str(response.get("error")))
    return response.get("result")
