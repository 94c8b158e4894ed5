"""The control channel to one local daemon, as the ``arceusd`` command line uses it: newline-framed JSON over
the unix socket ``control.sock`` in the daemon's state directory (:mod:`arceusd.base.control`; mode 0600, so only the
daemon's user reaches it).

Owns: which state directory (``state_dir``, else the CLI's default: ``$ARCEUS_STATE_DIR`` or the platform's
folder, :func:`arceusd.base.paths.default_state_dir`) and turning the control errors into :mod:`arceus.errors`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from arceus.errors import DaemonError, NoDaemonError
from arceusd.base.control import ControlError, NoDaemon, call
from arceusd.base.paths import StatePaths, default_state_dir


class Connection:
    """Blocking calls to the daemon of ``state_dir`` (None: the CLI's default state directory)."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        chosen = Path(state_dir) if state_dir is not None else default_state_dir()
        self.state_dir = chosen.expanduser().absolute()
        self.paths = StatePaths(self.state_dir)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        """Call ``method`` (``status``, ``submit``, ``job``, ``jobs``, ``cancel``...) and return its result.

        Error handling: :class:`NoDaemonError` when no daemon runs for the state directory, :class:`DaemonError`
        with the daemon's message when it refuses the call or does not answer in ``timeout`` seconds.
        """
        try:
            return call(self.paths.control_socket, method, params, timeout=timeout)
        except NoDaemon:
            raise NoDaemonError(
                f"no daemon is running for {self.state_dir} (start one with `arceusd start`, or pass the "
                "state_dir of the one you started)"
            ) from None
        except ControlError as exc:
            raise DaemonError(str(exc)) from None

    def __repr__(self) -> str:
        return f"Connection({str(self.state_dir)!r})"


__all__ = ["Connection"]
