"""The append-only, hash-chained ledger of signed receipts: ``<state_dir>/ledger.jsonl``.

One JSON object per line: ``seq`` (0, 1, ...), ``prev`` (the previous line's ``hash``; 64 zeros for the
first), the receipt's canonical ``body`` and the two keys and signatures (hex; the device's empty while it has
not countersigned), and ``hash`` = sha256(``LEDGER_DOMAIN`` || prev || seq || body || leader key || leader
signature || device key || device signature). Changing, removing, reordering or inserting a line breaks the
chain at that line; changing a receipt also breaks its signatures. Every line's receipt is verified
(``arceusd.market.receipts``) with the keys it carries, whose peer ids must be the ones the receipt names.

Appends are atomic for readers (one ``write`` of a whole line with ``O_APPEND``, then ``fsync``). A ledger is
verified when opened (:meth:`Ledger.open`); a ledger that does not verify is kept as it is, reported, and
refuses appends until its owner looks at it. :func:`verify_file` is what ``arceusd verify-ledger`` runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from arceusd.market.collect import unique
from arceusd.market.receipts import ReceiptError, SignedReceipt, decode, encode

LEDGER_FILE = "ledger.jsonl"
LEDGER_DOMAIN = b"arceus-ledger-v1\x00"
GENESIS = "0" * 64
MAX_LINE = 16 * 1024


class LedgerError(Exception):
    """The ledger cannot be used: the message names the line and what is wrong with it."""


def entry_hash(prev: str, seq: int, s: SignedReceipt) -> str:
    h = hashlib.sha256(LEDGER_DOMAIN)
    h.update(bytes.fromhex(prev))
    h.update(seq.to_bytes(8, "big"))
    for part in (encode(s.receipt), s.leader_key, s.leader_sig, s.device_key, s.device_sig):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.hexdigest()


def _line(prev: str, seq: int, s: SignedReceipt) -> bytes:
    obj = {"seq": seq, "prev": prev, "body": encode(s.receipt).hex(), "leader_key": s.leader_key.hex(),
           "leader_sig": s.leader_sig.hex(), "device_key": s.device_key.hex(), "device_sig": s.device_sig.hex(),
           "hash": entry_hash(prev, seq, s)}  # fmt: skip
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _parse(raw: bytes, number: int) -> tuple[int, str, str, SignedReceipt]:
    where = f"line {number}"
    if len(raw) > MAX_LINE:
        raise LedgerError(f"{where}: longer than {MAX_LINE} bytes")
    try:
        obj = json.loads(raw)
    except ValueError:
        raise LedgerError(f"{where}: not JSON") from None
    keys = {"seq", "prev", "body", "leader_key", "leader_sig", "device_key", "device_sig", "hash"}
    if not isinstance(obj, dict) or set(obj) != keys:
        raise LedgerError(f"{where}: must hold exactly the fields {sorted(keys)}")
    if type(obj["seq"]) is not int:
        raise LedgerError(f"{where}: seq must be an integer")
    try:
        parts = {k: bytes.fromhex(obj[k]) for k in keys - {"seq"}}
    except (TypeError, ValueError):
        raise LedgerError(f"{where}: a field is not hex") from None
    try:
        receipt = decode(parts["body"])
    except ReceiptError as exc:
        raise LedgerError(f"{where}: {exc}") from None
    signed = SignedReceipt(receipt, parts["leader_key"], parts["leader_sig"], parts["device_key"],
                           parts["device_sig"])  # fmt: skip
    return obj["seq"], obj["prev"], obj["hash"], signed


@dataclass
class Verified:
    entries: list[SignedReceipt] = field(default_factory=list)
    error: str = ""
    last_hash: str = GENESIS

    @property
    def ok(self) -> bool:
        return not self.error


def verify_lines(lines: Iterable[bytes]) -> Verified:
    """Walk the chain; stop at the first line that does not verify (``error`` names it)."""
    out = Verified()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            out.error = f"line {number}: empty"
            return out
        try:
            seq, prev, claimed, signed = _parse(raw, number)
            if seq != number - 1:
                raise LedgerError(f"line {number}: seq {seq}, expected {number - 1} (a line was removed or moved)")
            if prev != out.last_hash:
                raise LedgerError(f"line {number}: does not chain to the line before it")
            if entry_hash(prev, seq, signed) != claimed:
                raise LedgerError(f"line {number}: its hash does not match its content (the line was changed)")
            try:
                signed.verify(require_device=False)
            except ReceiptError as exc:
                raise LedgerError(f"line {number}: {exc}") from None
        except LedgerError as exc:
            out.error = str(exc)
            return out
        out.entries.append(signed)
        out.last_hash = claimed
    return out


def verify_file(path: Path) -> Verified:
    try:
        data = path.read_bytes()
    except OSError as exc:
        return Verified(error=f"cannot read {path}: {exc.strerror}")
    if data and not data.endswith(b"\n"):
        lines = data.count(b"\n") + 1
        return Verified(error=f"line {lines}: incomplete (no newline at the end)")
    return verify_lines(data.split(b"\n")[:-1])


class Ledger:
    """One daemon's ledger file; verified when opened, then appended to."""

    def __init__(self, path: Path, verified: Verified) -> None:
        self.path = path
        self.verified = verified

    @classmethod
    def open(cls, state_dir: Path) -> Ledger:
        path = state_dir / LEDGER_FILE
        return cls(path, verify_file(path) if path.exists() else Verified())

    @property
    def entries(self) -> list[SignedReceipt]:
        return self.verified.entries

    def append(self, s: SignedReceipt) -> None:
        """Add ``s`` (verified first) as the next line, durably. :class:`LedgerError` when the ledger did not
        verify when opened."""
        if not self.verified.ok:
            raise LedgerError(f"{self.path} did not verify ({self.verified.error}); not appending to it")
        try:
            s.verify(require_device=False)
        except ReceiptError as exc:
            raise LedgerError(f"refusing an invalid receipt: {exc}") from None
        line = _line(self.verified.last_hash, len(self.entries), s)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.verified.entries.append(s)
        self.verified.last_hash = json.loads(line)["hash"]


# --- summaries -----------------------------------------------------------------------------------------------
def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def earnings(entries: Iterable[SignedReceipt], me: str) -> dict[str, Any]:
    """What ``me`` earned: countersigned receipts for ``me``, by job, by day (UTC) and in total, in dollars (each
    receipt once: ``collect.unique``)."""
    entries = unique(entries)
    by_job: dict[str, float] = defaultdict(float)
    by_day: dict[str, float] = defaultdict(float)
    seconds = flops = 0.0
    count = 0
    for s in entries:
        r = s.receipt
        if r.device != me or not s.countersigned:
            continue
        by_job[r.job_id] += r.usd
        by_day[_day(r.issued_at)] += r.usd
        seconds += r.device_seconds
        flops += r.flops
        count += 1
    return {"device": me, "receipts": count, "device_hours": seconds / 3600.0, "flops": flops,
            "by_job": dict(sorted(by_job.items())), "by_day": dict(sorted(by_day.items())),
            "total_usd": sum(by_job.values())}  # fmt: skip


def bill(entries: Iterable[SignedReceipt], job_id: str) -> dict[str, Any]:
    """What the job's owner owes: its countersigned receipts by device (receipts a device did not countersign
    are listed apart and not owed). Each receipt counts once (``collect.unique``): the owner's ledger can hold
    the leader's copy and the device's countersigned one."""
    entries = unique(entries)
    by_device: dict[str, float] = defaultdict(float)
    unaccepted = 0
    seconds = 0.0
    owner = ""
    for s in entries:
        r = s.receipt
        if r.job_id != job_id:
            continue
        owner = r.owner
        if not s.countersigned:
            unaccepted += 1
            continue
        by_device[r.device] += r.usd
        seconds += r.device_seconds
    return {"job_id": job_id, "owner": owner, "by_device": dict(sorted(by_device.items())),
            "device_hours": seconds / 3600.0, "total_usd": sum(by_device.values()),
            "unaccepted_receipts": unaccepted}  # fmt: skip
