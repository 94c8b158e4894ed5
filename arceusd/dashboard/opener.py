"""Opening the dashboard in a browser without its token on any command line (issue 29).

A browser is started with the page to open as an argument, and every local user reads every process's command
line in ``/proc``; the dashboard's URL holds its token. So the browser is given a file instead: a small page in
the state directory, mode 0600 (created so, never readable by others even for a moment), that sends the
browser on to the token URL (a meta refresh, and a link where that is off). Only the file's path is on the
browser's command line; the token is in the file, which only the daemon's user can read, like the identity
key beside it. The file is rewritten at each ``arceusd dashboard`` (the token is drawn per daemon run).

:func:`redirect_page` is pure; :func:`write_opener` and :func:`open_in_browser` do the I/O.
"""

from __future__ import annotations

import html
import os
import webbrowser
from pathlib import Path

OPENER_NAME = "dashboard.html"
"""The page's name in the state directory."""


def redirect_page(url: str) -> str:
    """A page that sends the browser on to ``url`` (an ``http://`` URL, escaped wherever it appears)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not a dashboard URL: {url[:40]!r}")
    quoted = html.escape(url, quote=True)
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">\n'
        f'<meta http-equiv="refresh" content="0; url={quoted}">\n'
        '<meta name="referrer" content="no-referrer">\n<title>Arceus dashboard</title></head>\n'
        f'<body><p><a href="{quoted}" rel="noreferrer">Open the Arceus dashboard</a></p></body></html>\n'
    )


def write_opener(state_dir: Path, url: str) -> Path:
    """Write :func:`redirect_page` to ``state_dir/dashboard.html``, mode 0600, and return its path.

    The file is created with mode 0600 under a temporary name (never following a link), filled, and renamed
    over the old one, so no one else can open it at any moment.

    Error handling: OSError when the state directory cannot be written."""
    path = state_dir / OPENER_NAME
    tmp = state_dir / f".{OPENER_NAME}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, redirect_page(url).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def open_in_browser(page: Path) -> bool:
    """Open ``page`` (a local file) in the user's browser; True when one was started."""
    return webbrowser.open(page.resolve().as_uri())


__all__ = ["OPENER_NAME", "open_in_browser", "redirect_page", "write_opener"]
