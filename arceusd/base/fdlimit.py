"""The daemon's open-files limit: raising it at start, and accept loops that wait out running out of descriptors.

A daemon out of file descriptors fails wherever it next opens one: an accept, a checkpoint, a worker's pipe.
So it raises its soft limit to the hard limit as it starts (:func:`raise_nofile`; the soft default is 1,024 on
most Linux systems and 256 on macOS, while the hard limit is usually far higher), sizes what the peer port may
hold from the limit it got (:func:`arceusd.transport.gate_core.limits_for`), and every accept loop (the peer
port's gate, the control socket; the dashboard's hypercorn uses ``trio.serve_listeners``, which does the same)
treats ``EMFILE``/``ENFILE``/``ENOBUFS``/``ENOMEM`` as a reason to wait and try again (:class:`AcceptBackoff`),
never as the end of the daemon: the connections it would have accepted wait in the kernel's backlog meanwhile.
"""

from __future__ import annotations

import errno
import logging
import resource
from collections import Counter

import trio

log = logging.getLogger(__name__)

#: Errors of ``accept`` that say "no room for another descriptor now", not "this listener is broken".
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

#: A soft limit we never ask for more than (macOS reports an unlimited hard limit it refuses to grant).
_CEILING = 1 << 20


def nofile() -> int:
    """The soft open-files limit now."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _CEILING if soft == resource.RLIM_INFINITY else min(int(soft), _CEILING)


def raise_nofile() -> tuple[int, int]:
    """Raise the soft open-files limit as far as the hard limit allows; return (before, after).

    Error handling: a system that refuses (a sandbox, macOS below its unlimited hard limit) leaves the limit
    where it was, after trying halves of the target down to the old limit; never raises."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = nofile()
    target = _CEILING if hard == resource.RLIM_INFINITY else min(int(hard), _CEILING)
    while target > before:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            target //= 2
    after = nofile()
    if after > before:
        log.debug("open-files limit raised from %d to %d", before, after)
    return before, after


class AcceptBackoff:
    """How an accept loop waits when the process (or system) is out of descriptors: 50 ms, doubling to 1 s,
    reset by the next accept that works. ``counts`` holds the errors waited out, by name."""

    def __init__(self, name: str, first: float = 0.05, longest: float = 1.0) -> None:
        self.name = name
        self.first = first
        self.longest = longest
        self.delay = first
        self.counts: Counter[str] = Counter()

    def ok(self) -> None:
        self.delay = self.first

    async def wait(self, exc: OSError) -> None:
        """Wait after ``exc`` if it is a capacity error; re-raise anything else."""
        if exc.errno not in CAPACITY_ERRNOS:
            raise exc
        name = errno.errorcode.get(exc.errno or 0, "EMFILE")
        if self.delay == self.first:  # once per episode
            log.warning("%s: out of file descriptors (%s); accepting again shortly", self.name, name)
        self.counts[name] += 1
        await trio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.longest)


async def accept(listener: trio.SocketListener, backoff: AcceptBackoff) -> trio.SocketStream:
    """The listener's next connection, waiting out capacity errors (see :class:`AcceptBackoff`)."""
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            await backoff.wait(exc)
            continue
        backoff.ok()
        return stream


__all__ = ["CAPACITY_ERRNOS", "AcceptBackoff", "accept", "nofile", "raise_nofile"]
