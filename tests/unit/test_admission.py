"""Unit tests of the transport's slot and rate bookkeeping (arceusd.transport.admission), fed a clock."""

from __future__ import annotations

from arceusd.transport.admission import Admission, AdmissionConfig, host_of


def test_host_of_grpc_peer_strings() -> None:
    assert host_of("ipv4:10.0.0.7:5555") == "10.0.0.7"
    assert host_of("ipv6:[::1]:5555") == "::1"
    assert host_of("unix:/tmp/x") == "unix:/tmp/x"


def test_streams_never_take_call_slots() -> None:
    a = Admission(AdmissionConfig(max_streams=4, max_calls=2, max_pending_per_host=4, max_streams_per_host=4))
    for _ in range(4):
        assert a.admit_stream("h", 0.0) is None
    assert a.admit_stream("h", 0.0) == "streams_full"
    assert a.admit_call("h", 0.0) is None
    assert a.admit_call("other", 0.0) is None
    assert a.admit_call("h", 0.0) == "calls_full"
    a.release_call("h")
    assert a.admit_call("h", 0.0) is None


def test_pending_handshakes_per_host_and_streams_per_peer() -> None:
    a = Admission(AdmissionConfig(max_pending_per_host=2, max_streams_per_peer=1))
    assert a.admit_stream("h", 0.0) is None
    assert a.admit_stream("h", 0.0) is None
    assert a.admit_stream("h", 0.0) == "host_handshakes_full"
    assert a.admit_stream("g", 0.0) is None  # another source is not affected
    assert a.handshake_done("h", "peer-a") is None
    assert a.admit_stream("h", 0.0) is None  # one pending slot came free
    assert a.handshake_done("h", "peer-a") == "peer_streams_full"
    a.release_stream("h", "", pending=False)
    a.release_stream("h", "peer-a", pending=False)
    assert a.handshake_done("h", "peer-a") is None
    assert a.snapshot()["handshakes"] == 1  # g's
    a.release_stream("g", "", pending=True)
    assert a.snapshot()["handshakes"] == 0


def test_rate_limits_refill_with_time() -> None:
    a = Admission(AdmissionConfig(call_rate=10.0, call_burst=5.0, max_calls=100, max_calls_per_host=100))
    for _ in range(5):
        assert a.admit_call("h", 0.0) is None
        a.release_call("h")
    assert a.admit_call("h", 0.0) == "call_rate"
    assert a.admit_call("h", 0.25) is None  # 2.5 tokens back
    a.release_call("h")


def test_host_table_is_bounded() -> None:
    a = Admission(AdmissionConfig(max_hosts=10))
    for i in range(1000):
        assert a.admit_call(f"10.0.{i // 256}.{i % 256}", float(i)) is None
        a.release_call(f"10.0.{i // 256}.{i % 256}")
    assert a.snapshot()["hosts"] <= 10
