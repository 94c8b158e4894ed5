"""Bounds on the jobs strangers announce to us: validation, a rate per sender, and eviction (pure, clock fed in).

A JobAnnounce from any peer that said hello creates a record here (its spec, up to 1 MiB, is kept), so once
3,000 announcements grew a daemon to 2 GB, and job ids such as ``../x`` or terminal escapes were stored (and
a job's folder is named after its id). The job layer asks :meth:`AnnounceGuard.admit` before it parses an
announcement and tells :meth:`AnnounceGuard.added` once it stored one:

* the message's ids and hash must be in their exact formats (:func:`protocol.validation.check_job_announce`);
* new announcements per sender are rate-limited (a token bucket: ``rate`` per second, ``burst``); re-announcing
  a job we already know costs nothing and is not counted;
* at most ``per_source`` announced jobs per owner and ``total`` in all are remembered. Beyond ``per_source``
  the owner's oldest announcement goes. Beyond ``total`` the table is shared fairly (issue 29: 3,000
  announcements from 100 keys once pushed every honest job out of ``arceusd market``): the one evicted is an
  announcement of an owner that only said hello before any of an owner in our membership (one that answers
  our probes at its address); among those, one of the address host holding the most (members' hosts only: a
  stranger's address is its own word), then of the owner holding the most, then the oldest. So a flood of
  keys that only said hello evicts only its own announcements (a newcomer of theirs is refused once members'
  jobs fill the table), a flood of member keys from one host shares that host's part, and a member's job is
  evicted only for an owner holding fewer. Only jobs we merely *saw* are tracked: a job we own or joined is
  never evicted (the job layer checks that before dropping a record).

Every refusal and eviction is counted by reason in ``dropped`` (shown under ``announcements`` in
``arceusd status --json``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocol.errors import RemoteProtocolError
from protocol.messages import JobAnnounce
from protocol.validation import check_job_announce


@dataclass(frozen=True)
class AnnounceLimits:
    per_source: int = 8
    total: int = 64
    rate: float = 2.0
    burst: float = 10.0
    max_senders: int = 1024


@dataclass(frozen=True)
class _Entry:
    owner: str
    host: str  # "" unless the owner is a member
    member: bool
    order: int  # grows with each announcement stored


def fair_victim(table: Mapping[str, _Entry]) -> str:
    """The job id to evict from a full ``table`` by its fair shares (the rule in the module docstring)."""
    hosts = Counter(e.host for e in table.values() if e.member)
    owners = Counter(e.owner for e in table.values())

    def weight(item: tuple[str, _Entry]) -> tuple[bool, int, int, int]:
        e = item[1]
        return (not e.member, hosts[e.host] if e.member else 0, owners[e.owner], -e.order)

    return max(table.items(), key=weight)[0]


def address_host(address: str) -> str:
    """The host of a ``host:port`` address (brackets of an IPv6 host removed)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


class AnnounceGuard:
    def __init__(self, limits: AnnounceLimits | None = None) -> None:
        self.limits = limits or AnnounceLimits()
        self.dropped: Counter[str] = Counter()
        self._seen: OrderedDict[str, _Entry] = OrderedDict()  # job id -> its owner, oldest first
        self._order = 0
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # sender -> (tokens, when)

    def admit(self, sender: str, msg: JobAnnounce, *, known: bool, now: float) -> str | None:
        """None when the announcement may be handled; else the reason it is dropped (counted)."""
        try:
            check_job_announce(msg)
        except RemoteProtocolError as exc:
            self.dropped[exc.reason] += 1
            return exc.reason
        if known:
            return None
        tokens, when = self._buckets.pop(sender, (self.limits.burst, now))
        tokens = min(self.limits.burst, tokens + max(0.0, now - when) * self.limits.rate)
        if tokens < 1.0:
            self._buckets[sender] = (tokens, now)
            self.dropped["announce_rate"] += 1
            return "announce_rate"
        self._buckets[sender] = (tokens - 1.0, now)
        while len(self._buckets) > self.limits.max_senders:
            self._buckets.popitem(last=False)
        return None

    def refuse(self, reason: str) -> str:
        """Count a refusal the job layer found (e.g. a spec that does not parse or match its hash)."""
        self.dropped[reason] += 1
        return reason

    def added(self, job_id: str, owner: str, *, member: bool = False, host: str = "") -> list[str]:
        """Track a newly stored announced job of ``owner`` (``member``: in our membership; ``host``: its
        address host there); the ids of the announced jobs to forget now, the new one included when it is the
        one that goes."""
        self._order += 1
        self._seen[job_id] = _Entry(owner, host if member else "", member, self._order)
        evicted: list[str] = []
        mine = [j for j, e in self._seen.items() if e.owner == owner]
        for old in mine[: max(0, len(mine) - self.limits.per_source)]:
            evicted.append(old)
            del self._seen[old]
        while len(self._seen) > self.limits.total:
            victim = fair_victim(self._seen)
            evicted.append(victim)
            del self._seen[victim]
        self.dropped["announce_evicted"] += len(evicted)
        return evicted

    def forget(self, job_id: str) -> None:
        """The job is no longer a mere announcement (joined, owned, or gone)."""
        self._seen.pop(job_id, None)

    def summary(self) -> dict[str, Any]:
        return {"tracked": len(self._seen), "dropped": dict(self.dropped)}
