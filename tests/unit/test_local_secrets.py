"""Issue 29 (b): what another local user must not read. The page that opens the dashboard (it holds the token)
and the daemon's log are mode 0600 whatever the umask and whoever created the file first; the browser is given
the page's path, never the token URL."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from arceusd.base.logs import make_private, open_private_log, setup_logging
from arceusd.dashboard import opener

URL = "http://127.0.0.1:8123/tok3n_Secret-xyz/"


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)  # the worst case: files created without a mode come out 0666
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_opener_page_is_private_and_leads_to_the_url(tmp_path: Path, open_umask: None) -> None:
    (tmp_path / opener.OPENER_NAME).write_text("old")
    (tmp_path / opener.OPENER_NAME).chmod(0o644)
    page = opener.write_opener(tmp_path, URL)
    assert page == tmp_path / opener.OPENER_NAME and _mode(page) == 0o600
    text = page.read_text()
    assert f'content="0; url={URL}"' in text and f'href="{URL}"' in text
    assert [p.name for p in tmp_path.iterdir()] == [opener.OPENER_NAME]  # no temporary file left


def test_the_opener_page_escapes_the_url_and_takes_only_http() -> None:
    text = opener.redirect_page('http://h:1/"><script>x</script>')
    assert "<script>x" not in text and "&quot;&gt;&lt;script&gt;" in text
    with pytest.raises(ValueError):
        opener.redirect_page("javascript:alert(1)")


def test_the_browser_gets_the_page_not_the_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []

    def fake_open(url: str) -> bool:
        opened.append(url)
        return True

    monkeypatch.setattr("webbrowser.open", fake_open)
    page = opener.write_opener(tmp_path, URL)
    assert opener.open_in_browser(page)
    assert opened == [page.resolve().as_uri()] and "tok3n" not in opened[0]


def test_the_log_file_is_private(tmp_path: Path, open_umask: None) -> None:
    fresh = tmp_path / "a.log"
    setup_logging("info", fresh)
    try:
        logging.getLogger("t").info("hello")
    finally:
        for handler in logging.getLogger().handlers:
            handler.close()
        logging.getLogger().handlers[:] = []
    assert _mode(fresh) == 0o600 and "hello" in fresh.read_text()
    older = tmp_path / "b.log"
    older.write_text("kept\n")
    older.chmod(0o644)
    make_private(older)
    assert _mode(older) == 0o600 and older.read_text() == "kept\n"
    detached = tmp_path / "c.log"
    os.close(open_private_log(detached))
    assert _mode(detached) == 0o600
