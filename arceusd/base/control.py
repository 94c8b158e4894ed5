"""The local control API: the CLI talks to its own daemon over a unix socket in the state directory (mode 0600).

Framing: one JSON object per line each way. Request ``{"method": str, "params": {...}}``; response
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": str}``. Lines are capped (:data:`MAX_LINE`); a client
that sends garbage gets an error response, never a crash. The socket is only reachable by the daemon's user
(directory 0700, socket 0600), which is the whole authorisation story for local control.

This module is the client side and what both sides share: plain blocking sockets (:func:`call`), so the CLI never
needs an event loop or imports trio (a command starts faster). The daemon's side is
:mod:`arceusd.base.control_server`.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

MAX_LINE = 1 << 20
Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ControlError(Exception):
    """A control call failed: no daemon, or the daemon answered with an error (the message says which)."""


class NoDaemon(ControlError):
    """No daemon is listening on the control socket."""


class RequestError(Exception):
    """Raised by handlers for a bad request; its message goes back to the CLI as is."""


def socket_alive(path: Path) -> bool:
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
    return path.exists() and socket_alive(path)


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
