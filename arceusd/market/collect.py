"""The job owner's copy of every receipt for its job: what a device or leader hands over, and what the owner keeps.

A leader keeps the receipts it signs and a device the ones it countersigns; the owner's ``arceusd bill`` reads the
owner's own ledger. While the owner leads, that ledger has every receipt, but after a standby took the job over
(the owner was gone) the new leader signs the rest, and a receipt a device countersigned can miss the leader's
ledger when the leader died before the answer came. So once its job has ended, the owner asks the job's leaders
and every device it knows of in the job for the receipts they keep for it
(:class:`~protocol.market_wire.ReceiptsRequest`, paged by :data:`~protocol.market_wire.RECEIPTS_PER_BATCH`) and
appends the ones it lacks. Pure: the service (``arceusd.market.service``) does the asking.

What the owner accepts (:func:`accept`): a canonical body (``receipts.decode``) for this job and this owner,
signed by a peer the owner knows led the job (``job.leaders``: itself, or a standby whose signed checkpoints it
took), with a leader signature and, when present, a device countersignature that verify against keys naming the
receipt's peers. A stranger cannot add to a bill: it would need a leader's key. Bounded: at most
:data:`MAX_PAGES_PER_PEER` pages from a peer per round and :data:`MAX_PEERS` peers per round.

One receipt can reach the owner's ledger twice (as the leader kept it, and countersigned from the device): the
ledger's summaries count each receipt once (:func:`unique`), its countersigned copy when there is one.
"""

from __future__ import annotations

from collections.abc import Iterable

from arceusd.market.receipts import ReceiptError, SignedReceipt, decode, encode
from protocol.market_wire import RECEIPTS_PER_BATCH, ReceiptBatch, ReceiptEntry

MAX_PAGES_PER_PEER = 64
"""Pages (of :data:`RECEIPTS_PER_BATCH`) the owner reads from one peer in one round: 2,048 receipts."""
MAX_PEERS = 64
"""Peers the owner asks in one round."""
MAX_START = RECEIPTS_PER_BATCH * MAX_PAGES_PER_PEER
"""The highest ``start`` a keeper answers (beyond it: an empty batch and the reason)."""
ROUNDS_S = (2.0, 10.0, 30.0)
"""When the owner asks, in seconds after it saw its job end: the last receipts are still being countersigned
when the job ends; a later round finds them."""


def key(s: SignedReceipt) -> tuple[bytes, bytes]:
    """One receipt, whoever keeps it (the leader's signature is deterministic over the body)."""
    return encode(s.receipt), s.leader_sig


def unique(entries: Iterable[SignedReceipt]) -> list[SignedReceipt]:
    """Each receipt once, in first-seen order: its countersigned copy when the ledger holds one."""
    out: dict[tuple[bytes, bytes], SignedReceipt] = {}
    for s in entries:
        k = key(s)
        if k not in out or (s.countersigned and not out[k].countersigned):
            out[k] = s
    return list(out.values())


def kept_for(entries: Iterable[SignedReceipt], job_id: str, owner: str) -> list[SignedReceipt]:
    """The receipts a keeper hands the job's owner: every one it keeps for that job and owner, each once."""
    return unique(s for s in entries if s.receipt.job_id == job_id and s.receipt.owner == owner)


def page(entries: list[SignedReceipt], job_id: str, start: int) -> ReceiptBatch:
    """The batch answering a request for ``entries[start:]``."""
    if not 0 <= start <= MAX_START:
        return ReceiptBatch(job_id, (), False, f"start must be in 0..{MAX_START}, got {start}")
    chunk = entries[start : start + RECEIPTS_PER_BATCH]
    return ReceiptBatch(job_id, tuple(to_entry(s) for s in chunk), start + RECEIPTS_PER_BATCH < len(entries))


def to_entry(s: SignedReceipt) -> ReceiptEntry:
    return ReceiptEntry(encode(s.receipt), s.leader_key, s.leader_sig, s.device_key, s.device_sig)


def accept(entry: ReceiptEntry, job_id: str, owner: str, leaders: Iterable[str]) -> SignedReceipt:
    """The entry as a verified receipt the owner may keep; :class:`ReceiptError` says why not."""
    r = decode(entry.body)
    if r.job_id != job_id:
        raise ReceiptError(f"a receipt for job {r.job_id[:12]}, not this job")
    if r.owner != owner:
        raise ReceiptError("a receipt that names another owner")
    if r.leader not in set(leaders):
        raise ReceiptError(f"signed by {r.leader[:12]}, who did not lead this job as far as its owner knows")
    signed = SignedReceipt(r, entry.leader_key, entry.leader_sig, entry.device_key, entry.device_sig)
    if bool(entry.device_key) != bool(entry.device_sig):
        raise ReceiptError("a device key without a countersignature, or the reverse")
    signed.verify(require_device=False)
    return signed


def new_ones(have: Iterable[SignedReceipt], got: Iterable[SignedReceipt]) -> list[SignedReceipt]:
    """What of ``got`` the owner's ledger lacks: receipts it does not hold, or holds only uncountersigned."""
    best: dict[tuple[bytes, bytes], bool] = {}
    for s in have:
        k = key(s)
        best[k] = best.get(k, False) or s.countersigned
    out = []
    for s in got:
        k = key(s)
        if k in best and (best[k] or not s.countersigned):
            continue
        best[k] = s.countersigned
        out.append(s)
    return out


__all__ = ["MAX_PAGES_PER_PEER", "MAX_PEERS", "ROUNDS_S", "accept", "kept_for", "key", "new_ones", "page", "unique"]
