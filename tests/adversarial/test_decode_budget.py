"""Issue 29 (a): forty 4 MiB frames of densely packed empty msgpack maps, from a key that only said hello, grew
a daemon by ~500 MiB, stalled ``status`` for 10 s and made its peers declare it dead: msgpack built the whole
object tree (4 million maps a frame) on the event loop before any schema check or per-sender limit. Now the
payload is read by its schema (``protocol/wire_reader.py``: a map where the schema wants something else is
refused by its first byte) and the sender's rate limit applies before decoding (``arceusd/network/peers.py``)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.victim import Watch, assert_healthy, baseline, hostile, peer_address
from tests.harness import Daemon, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FRAMES = 40
RSS_BOUND_MIB = 64
STATUS_P99_BOUND_S = 0.5


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    common = ["--host", "127.0.0.1", "--port", "0", "--no-mdns", "--no-auto-join"]
    d0 = Daemon(tmp_path / "d0", common).start()
    d1 = Daemon(tmp_path / "d1", [*common, "--peer", peer_address(d0)]).start()
    try:
        id0 = d0.status()["peer_id"]
        wait_for(lambda: _state_of(d1, id0) == "alive", 20, 0.1, "d1 sees d0 alive")
        yield d0, d1
    finally:
        assert d1.stop() == 0
        assert d0.stop() == 0


def _state_of(d: Daemon, peer: str) -> str | None:
    return next((p["state"] for p in d.call("peers") if p["peer_id"] == peer), None)


class ViewOf:
    """How ``observer`` sees ``peer``, sampled every 0.1 s until the block ends."""

    def __init__(self, observer: Daemon, peer: str) -> None:
        self.observer, self.peer = observer, peer
        self.states: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ViewOf:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.states[str(_state_of(self.observer, self.peer))] += 1
            except Exception:
                self.states["no_answer"] += 1
            self._stop.wait(0.1)


def test_dense_empty_maps_cost_what_their_bytes_cost(pair: tuple[Daemon, Daemon]) -> None:
    d0, d1 = pair
    base = baseline(d0)
    with ViewOf(d1, d0.status()["peer_id"]) as view, Watch(d0) as watch:
        result = hostile(
            "dense-maps", peer_address(d0), "--count", str(FRAMES), "--mib", "4", "--batch", "4", timeout=200
        )
    print(f"attack: {result}; d1's view of d0: {dict(view.states)}")
    assert result["payload_bytes"] > 4_000_000, result
    assert result["answers"] == {"empty": FRAMES}, result  # each refused, none timed out
    assert_healthy(watch.report, base, rss_extra_mib=RSS_BOUND_MIB)
    lat = sorted(watch.report.status_latencies)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    assert p99 < STATUS_P99_BOUND_S, (p99, watch.report.summary())
    assert "dead" not in view.states, view.states  # (a suspicion refuted at once happens on a loaded machine)
    refused = d0.status()["dropped"]["membership"]
    assert refused.get("wrong_type", 0) + refused.get("unknown_field", 0) >= FRAMES, refused
