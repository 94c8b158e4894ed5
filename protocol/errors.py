"""The two error families of the wire.

Modelled on h11's ``LocalProtocolError`` / ``RemoteProtocolError``:

* :class:`RemoteProtocolError` - the remote peer sent something bad (malformed, forged, replayed, too big, for
  another job...). The receiver drops the message, counts ``reason`` and may distrust the peer. Never a crash.
* :class:`LocalProtocolError` - we misused the API (encoding an unsupported dtype, a payload over our own limit).
  This is a bug on our side and should surface loudly.

Every error carries a short machine-readable ``reason`` (used as a counter key) and a human message that says what
was wrong and, where it helps, what to do.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of both families. ``reason`` is a stable, short identifier for counting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RemoteProtocolError(ProtocolError):
    """The peer sent something we must reject: drop it, count ``reason``, carry on."""


class LocalProtocolError(ProtocolError):
    """We used the protocol API wrongly: a bug in the caller."""
