"""arceusd/base/failures.py: any exception reaching the command line becomes one line and an exit code."""

from __future__ import annotations

from arceusd.base.failures import EXIT_FAILURE, EXIT_STARTUP, StartupError, debug_requested, one_line
from arceusd.device.config import ConfigError


def test_errors_written_for_the_user_are_found_inside_nested_groups() -> None:
    exc = BaseExceptionGroup("outer", [ExceptionGroup("inner", [StartupError("port 1 is taken;\n use --port 0")])])
    assert one_line(exc) == ("port 1 is taken; use --port 0", EXIT_STARTUP)
    assert one_line(ConfigError("bad key")) == ("bad key", EXIT_STARTUP)
    assert one_line(PermissionError(13, "Permission denied", "/x")) == ("/x: permission denied", EXIT_STARTUP)


def test_anything_else_is_one_line_pointing_at_debug() -> None:
    message, code = one_line(ExceptionGroup("g", [KeyError("k")]))
    assert code == EXIT_FAILURE and "\n" not in message
    assert "KeyError" in message and "--log-level debug" in message


def test_debug_requested() -> None:
    assert debug_requested(["start", "--log-level", "debug"]) and debug_requested(["--log-level=debug"])
    assert not debug_requested(["start", "--log-level", "info"]) and not debug_requested(["--log-level"])


def test_an_os_error_without_a_file_says_what_to_do() -> None:
    """``[Errno 28] No space left on device`` alone names no fix: the line adds what to do, without the errno."""
    import errno
    import os

    line, code = one_line(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert line == "no space left on device; free some disk space and start again" and code == 2
    line, _ = one_line(OSError(errno.EMFILE, os.strerror(errno.EMFILE)))
    assert "[Errno" not in line and "ulimit -n" in line
    line, _ = one_line(OSError(errno.ECONNRESET, os.strerror(errno.ECONNRESET)))
    assert line.startswith("connection reset by peer; ") and "--log-level debug" in line
    line, _ = one_line(PermissionError(errno.EACCES, "Permission denied", "/x/identity.key"))
    assert line == "/x/identity.key: permission denied"
