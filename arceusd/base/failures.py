"""How a failure reaches the user: one line saying what went wrong and what to do, a traceback only when asked.

:class:`StartupError` is what a service raises when the daemon cannot start as configured (a taken port, an
interface without an address); its message already names the fix. :func:`one_line` turns any exception that
reaches the command line (trio wraps a service's error in exception groups, possibly several deep) into that line;
the ``arceusd`` entry point prints it and exits non-zero, and re-raises instead at ``--log-level debug``.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

from arceusd.base.control import ControlError
from arceusd.base.identity import IdentityError

EXIT_FAILURE = 1
EXIT_STARTUP = 2


class StartupError(Exception):
    """The daemon cannot start as configured; the message says what went wrong and what to do."""


class UserError(Exception):
    """An error of a higher layer whose message is written for the user (a bad ``config.toml``, mDNS that cannot
    run): :func:`one_line` prints it as it is. Its modules subclass it, so this one imports none of them."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out += leaves(inner)
        return out
    return [exc]


def _expected() -> tuple[type[BaseException], ...]:
    """Errors whose message is written for the user (each module's own error type, and OSError's)."""
    return (StartupError, UserError, IdentityError, ControlError, OSError)


def one_line(exc: BaseException) -> tuple[str, int]:
    """(the line to print, the exit code) for an exception that reached the command line."""
    found = leaves(exc)
    expected = _expected()
    for leaf in found:  # the first error written for the user explains the failure; the rest are its echoes
        if isinstance(leaf, expected):
            message = _describe(leaf)
            return message, EXIT_STARTUP
    leaf = found[0] if found else exc
    text = f"{type(leaf).__name__}: {leaf}".strip().rstrip(":")
    return (
        f"unexpected error ({_flat(text)}); run it again with --log-level debug for the traceback and report it",
        EXIT_FAILURE,
    )


_OS_ADVICE = {
    errno.ENOSPC: "free some disk space and start again",
    errno.EDQUOT: "free some disk space and start again",
    errno.EACCES: "check the permissions of the state directory (--state-dir) and its files",
    errno.EPERM: "check the permissions of the state directory (--state-dir) and its files",
    errno.EROFS: "choose a writable state directory (--state-dir)",
    errno.EMFILE: "raise the open-files limit (ulimit -n) and start again",
    errno.ENFILE: "close some programs (the system is out of file handles) and start again",
    errno.EADDRINUSE: "choose another port (--port N, or --port 0 for any free one)",
    errno.EADDRNOTAVAIL: "choose an address this machine has (--host, --advertise-host)",
    errno.ENOMEM: "close some programs or lower lend_memory_mib, then start again",
}
"""What to do about an operating-system error that names no file (its bare text, ``[Errno 28] No space left on
device``, says what went wrong but not what to do)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, StartupError) and exc.strerror:
        what = exc.strerror.lower()
        if exc.filename:
            return f"{exc.filename}: {what}"
        advice = _OS_ADVICE.get(exc.errno or 0, "run it again with --log-level debug to see where it happened")
        return f"{what}; {advice}"
    return _flat(str(exc)) or type(exc).__name__


def _flat(text: str) -> str:
    return " ".join(text.split())


def debug_requested(argv: Sequence[str]) -> bool:
    """Whether the command line asks for ``--log-level debug`` (where tracebacks are wanted)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--log-level=debug" or (arg == "--log-level" and i + 1 < len(args) and args[i + 1] == "debug"):
            return True
    return False


__all__ = ["EXIT_FAILURE", "EXIT_STARTUP", "StartupError", "debug_requested", "leaves", "one_line"]
