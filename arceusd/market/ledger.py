"""The append-only, hash-chained ledger of signed receipts: ``<state_dir>/ledger.jsonl`` and its signed head
``<state_dir>/ledger.head``.

One JSON object per line: ``seq`` (0, 1, ...), ``prev`` (the previous line's ``hash``; 64 zeros for the first),
the line's content, ``hash`` and ``keeper_sig``. A receipt line's content is the receipt's canonical ``body`` and
the two keys and signatures (hex; the device's empty while it has not countersigned), its ``hash`` =
sha256(``LEDGER_DOMAIN`` || prev || seq || body || leader key || leader signature || device key || device
signature). An authorisation line (``arceus.market.authority``: the job's owner lets a leader sign its receipts)
holds ``auth`` (the signed authorisation, hex), its ``hash`` = sha256(``AUTH_LINE_DOMAIN`` || prev || seq ||
auth). ``keeper_sig`` is the keeper's (this daemon's) Ed25519 signature over ``KEEPER_DOMAIN`` || seq || prev ||
hash; the head file holds the line count, the last hash, the keeper's public key and its signature over them.

What a ledger proves, and what each check finds:
- a changed line breaks its hash; a changed receipt with its chain recomputed breaks the receipt's signatures;
- a line removed, inserted or reordered and the chain recomputed breaks the keeper's signature of every line
  after it (only the keeper's key can sign ``(seq, prev, hash)``); lines removed from the end leave fewer lines
  than the signed head counts;
- a receipt signed by a leader that is neither the job's owner nor named by an owner-signed authorisation held
  earlier in the ledger is refused (two self-made keys cannot name a real job and owner);
- an empty file, a file without its head, or (for this daemon's own ledger) a head signed by another key is
  not a ledger.
Every refusal names its line and receipt. The head is rewritten after each append; a crash between the two
leaves one keeper-signed line beyond the head, which verifies.

Appends are atomic for readers (one ``write`` of a whole line with ``O_APPEND``, then ``fsync``; the head
replaced by rename). A ledger is verified when opened (:meth:`Ledger.open`); a ledger that does not verify is
kept as it is, reported, and refuses appends until its owner looks at it. :func:`verify_file` is what
``arceusd verify-ledger``, ``bill`` and ``earnings`` run.
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

from arceusd.base.identity import Identity, load_or_create_identity, peer_id_from_public_key, verify_signature
from arceusd.market.authority import AuthorityError, SignedAuthorisation, from_bytes, leader_allowed
from arceusd.market.collect import unique
from arceusd.market.receipts import ReceiptError, SignedReceipt, billed, decode, encode

LEDGER_FILE = "ledger.jsonl"
HEAD_FILE = "ledger.head"
LEDGER_DOMAIN = b"arceus-ledger-v1\x00"
AUTH_LINE_DOMAIN = b"arceus-ledger-authorisation-v1\x00"
KEEPER_DOMAIN = b"arceus-ledger-keeper-v1\x00"
HEAD_DOMAIN = b"arceus-ledger-head-v1\x00"
GENESIS = "0" * 64
MAX_LINE = 16 * 1024
_RECEIPT_KEYS = frozenset(
    {"seq", "prev", "body", "leader_key", "leader_sig", "device_key", "device_sig", "hash", "keeper_sig"}
)
_AUTH_KEYS = frozenset({"seq", "prev", "auth", "hash", "keeper_sig"})


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


def auth_hash(prev: str, seq: int, a: SignedAuthorisation) -> str:
    h = hashlib.sha256(AUTH_LINE_DOMAIN)
    h.update(bytes.fromhex(prev))
    h.update(seq.to_bytes(8, "big"))
    h.update(a.to_bytes())
    return h.hexdigest()


def keeper_bytes(seq: int, prev: str, line_hash: str) -> bytes:
    """What the keeper signs for a line: its place in the chain."""
    return KEEPER_DOMAIN + seq.to_bytes(8, "big") + bytes.fromhex(prev) + bytes.fromhex(line_hash)


def head_bytes(count: int, last_hash: str, keeper_key: bytes) -> bytes:
    return HEAD_DOMAIN + count.to_bytes(8, "big") + bytes.fromhex(last_hash) + keeper_key


Entry = SignedReceipt | SignedAuthorisation


def _line(prev: str, seq: int, e: Entry, keeper: Identity) -> tuple[bytes, str]:
    if isinstance(e, SignedAuthorisation):
        h = auth_hash(prev, seq, e)
        obj: dict[str, Any] = {"seq": seq, "prev": prev, "auth": e.to_bytes().hex(), "hash": h}
    else:
        h = entry_hash(prev, seq, e)
        obj = {
            "seq": seq,
            "prev": prev,
            "body": encode(e.receipt).hex(),
            "leader_key": e.leader_key.hex(),
            "leader_sig": e.leader_sig.hex(),
            "device_key": e.device_key.hex(),
            "device_sig": e.device_sig.hex(),
            "hash": h,
        }
    obj["keeper_sig"] = keeper.sign(keeper_bytes(seq, prev, h)).hex()
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n", h


def describe(e: Entry) -> str:
    """One receipt or authorisation, as an error names it."""
    if isinstance(e, SignedAuthorisation):
        a = e.auth
        return f"authorisation of {a.leader[:12]} for job {a.job_id[:12]}"
    r = e.receipt
    return (
        f"receipt job {r.job_id[:12]} leader {r.leader[:12]} device {r.device[:12]} steps "
        f"{r.step_from}..{r.step_to} ${r.usd:.2f}"
    )


def _parse(raw: bytes, number: int) -> tuple[int, str, str, bytes, Entry]:
    where = f"line {number}"
    if len(raw) > MAX_LINE:
        raise LedgerError(f"{where}: longer than {MAX_LINE} bytes")
    try:
        obj = json.loads(raw)
    except ValueError:
        raise LedgerError(f"{where}: not JSON") from None
    keys = _AUTH_KEYS if isinstance(obj, dict) and "auth" in obj else _RECEIPT_KEYS
    if not isinstance(obj, dict) or set(obj) != keys:
        raise LedgerError(f"{where}: must hold exactly the fields {sorted(keys)}")
    if type(obj["seq"]) is not int or obj["seq"] < 0:
        raise LedgerError(f"{where}: seq must be an integer >= 0")
    try:
        parts = {k: bytes.fromhex(obj[k]) for k in keys - {"seq"}}
    except (TypeError, ValueError):
        raise LedgerError(f"{where}: a field is not hex") from None
    if len(parts["prev"]) != 32 or len(parts["hash"]) != 32:
        raise LedgerError(f"{where}: prev and hash must be 64 hex characters")
    entry: Entry
    try:
        if "auth" in obj:
            entry = from_bytes(parts["auth"])
        else:
            receipt = decode(parts["body"])
            entry = SignedReceipt(
                receipt, parts["leader_key"], parts["leader_sig"], parts["device_key"], parts["device_sig"]
            )
    except (ReceiptError, AuthorityError) as exc:
        raise LedgerError(f"{where}: {exc}") from None
    return obj["seq"], obj["prev"], obj["hash"], parts["keeper_sig"], entry


@dataclass
class Verified:
    entries: list[SignedReceipt] = field(default_factory=list)
    auths: list[SignedAuthorisation] = field(default_factory=list)
    error: str = ""
    last_hash: str = GENESIS
    lines: int = 0
    keeper: str = ""
    """The keeper's peer id (from the signed head)."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def granted(self) -> set[tuple[str, str, str]]:
        return {(a.auth.job_id, a.auth.owner, a.auth.leader) for a in self.auths}


def verify_lines(lines: Iterable[bytes], keeper_key: bytes) -> Verified:
    """Walk the chain; stop at the first line that does not verify (``error`` names it and its receipt)."""
    out = Verified(keeper=_peer(keeper_key))
    granted: set[tuple[str, str, str]] = set()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            out.error = f"line {number}: empty"
            return out
        try:
            seq, prev, claimed, keeper_sig, entry = _parse(raw, number)
            where = f"line {number} ({describe(entry)})"
            if seq != number - 1:
                raise LedgerError(f"line {number}: seq {seq}, expected {number - 1} (a line was removed or moved)")
            if prev != out.last_hash:
                raise LedgerError(f"line {number}: does not chain to the line before it")
            computed = (
                auth_hash(prev, seq, entry) if isinstance(entry, SignedAuthorisation) else entry_hash(prev, seq, entry)
            )
            if computed != claimed:
                raise LedgerError(f"line {number}: its hash does not match its content (the line was changed)")
            if isinstance(entry, SignedReceipt):
                try:
                    entry.verify(require_device=False)
                except ReceiptError as exc:
                    raise LedgerError(f"{where}: {exc}") from None
                r = entry.receipt
                if not leader_allowed(r.job_id, r.owner, r.leader, granted):
                    raise LedgerError(
                        f"{where}: signed by {r.leader[:12]}, neither the job's owner nor a leader "
                        "the owner authorised (a receipt signed with made-up keys)"
                    )
            if not verify_signature(keeper_key, keeper_sig, keeper_bytes(seq, prev, claimed)):
                raise LedgerError(
                    f"{where}: the keeper's signature does not hold (a line was removed, inserted or "
                    "changed and the chain recomputed)"
                )
        except LedgerError as exc:
            out.error = str(exc)
            return out
        if isinstance(entry, SignedAuthorisation):
            out.auths.append(entry)
            granted.add((entry.auth.job_id, entry.auth.owner, entry.auth.leader))
        else:
            out.entries.append(entry)
        out.last_hash = claimed
        out.lines = number
    return out


def _peer(key: bytes) -> str:
    try:
        return peer_id_from_public_key(key)
    except ValueError:
        return ""


def head_path(path: Path) -> Path:
    return path.with_name(HEAD_FILE) if path.name == LEDGER_FILE else path.with_name(path.name + ".head")


def read_head(path: Path) -> tuple[int, str, bytes]:
    """``(count, last hash, keeper key)`` of the signed head beside the ledger at ``path``; :class:`LedgerError`
    when it is missing, malformed or its signature does not hold."""
    where = head_path(path)
    try:
        obj = json.loads(where.read_bytes()[:4096])
        count, last, key, sig = obj["count"], obj["hash"], bytes.fromhex(obj["keeper_key"]), bytes.fromhex(obj["sig"])
    except FileNotFoundError:
        raise LedgerError(f"no signed head ({where.name} beside it): nothing shows who kept this ledger") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise LedgerError(f"its head {where.name} is not a signed head") from None
    if type(count) is not int or count < 0 or not isinstance(last, str) or len(last) != 64 or len(key) != 32:
        raise LedgerError(f"its head {where.name} is not a signed head")
    try:
        signed = head_bytes(count, last, key)
    except ValueError:
        raise LedgerError(f"its head {where.name} is not a signed head") from None
    if not verify_signature(key, sig, signed):
        raise LedgerError(f"its head {where.name}: the keeper's signature does not hold")
    return count, last, key


def verify_file(path: Path, keeper_key: bytes | None = None) -> Verified:
    """Verify the ledger at ``path`` and its head; with ``keeper_key``, its keeper must be that key (this daemon's
    own ledger)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return Verified(error=f"cannot read {path}: {exc.strerror}")
    if not data:
        return Verified(error="the file is empty: a ledger holds at least one line and its keeper's signed head")
    if not data.endswith(b"\n"):
        lines = data.count(b"\n") + 1
        return Verified(error=f"line {lines}: incomplete (no newline at the end)")
    try:
        count, last, key = read_head(path)
    except LedgerError as exc:
        return Verified(error=str(exc))
    if keeper_key is not None and key != keeper_key:
        return Verified(
            error=f"kept by {_peer(key)[:12]}, not by this daemon ({_peer(keeper_key)[:12]}): its lines "
            "were signed again with another key"
        )
    out = verify_lines(data.split(b"\n")[:-1], key)
    if out.ok and out.lines < count:
        out.error = (
            f"the ledger ends at line {out.lines} but its keeper's signed head counts {count} lines: "
            f"line(s) {out.lines + 1}..{count} were removed"
        )
    elif out.ok and count and _hash_at(data, count) != last:
        out.error = f"line {count}: not the line its keeper's signed head names (the ledger was rewritten)"
    return out


def _hash_at(data: bytes, count: int) -> str:
    try:
        return str(json.loads(data.split(b"\n")[count - 1])["hash"])
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


class Ledger:
    """One daemon's ledger file, kept (signed) by its identity; verified when opened, then appended to."""

    def __init__(self, path: Path, verified: Verified, keeper: Identity) -> None:
        self.path = path
        self.verified = verified
        self.keeper = keeper
        self._by_job: tuple[int, str, dict[str, JobReceipts]] = (-1, "", {})

    def job_receipts(self, me: str) -> dict[str, JobReceipts]:
        """:func:`job_receipts` of this ledger's entries for ``me``, computed again only when an entry was appended
        (``status`` lists them on every call, and the dashboard asks for it every second)."""
        count, who, summary = self._by_job
        if count != len(self.entries) or who != me:
            summary = job_receipts(self.entries, me)
            self._by_job = (len(self.entries), me, summary)
        return summary

    @classmethod
    def open(cls, state_dir: Path, keeper: Identity | None = None) -> Ledger:
        """The ledger of ``state_dir``, kept by ``keeper`` (default: the state directory's identity)."""
        if keeper is None:
            keeper = load_or_create_identity(state_dir)
        path = state_dir / LEDGER_FILE
        if path.exists():
            verified = verify_file(path, keeper.public_key_raw)
        elif head_path(path).exists():
            verified = Verified(error=f"{LEDGER_FILE} is gone but its keeper's signed head remains")
        else:
            verified = Verified(keeper=keeper.peer_id)
        return cls(path, verified, keeper)

    @property
    def entries(self) -> list[SignedReceipt]:
        return self.verified.entries

    def authorised(self, job_id: str, owner: str, leader: str) -> bool:
        return leader_allowed(job_id, owner, leader, self.verified.granted)

    def authority(self, job_id: str, owner: str, leader: str) -> SignedAuthorisation | None:
        """The owner's authorisation of ``leader`` for the job this ledger holds, if any."""
        for a in self.verified.auths:
            if (a.auth.job_id, a.auth.owner, a.auth.leader) == (job_id, owner, leader):
                return a
        return None

    def authorise(self, a: SignedAuthorisation) -> bool:
        """Keep the owner's authorisation ``a`` (verified first) unless this ledger holds it; whether it was new."""
        if self.authority(a.auth.job_id, a.auth.owner, a.auth.leader) is not None:
            return False
        try:
            a.verify()
        except AuthorityError as exc:
            raise LedgerError(f"refusing an invalid authorisation: {exc}") from None
        self._write(a)
        self.verified.auths.append(a)
        return True

    def append(self, s: SignedReceipt) -> None:
        """Add ``s`` (verified first: its signatures, and a leader the job's owner authorised) as the next line,
        durably. :class:`LedgerError` when the ledger did not verify when opened, or ``s`` does not."""
        try:
            s.verify(require_device=False)
        except ReceiptError as exc:
            raise LedgerError(f"refusing an invalid receipt: {exc}") from None
        r = s.receipt
        if not self.authorised(r.job_id, r.owner, r.leader):
            raise LedgerError(f"refusing a receipt signed by {r.leader[:12]}: the job's owner did not authorise it")
        self._write(s)
        self.verified.entries.append(s)

    def _write(self, e: Entry) -> None:
        if not self.verified.ok:
            raise LedgerError(f"{self.path} did not verify ({self.verified.error}); not appending to it")
        seq = self.verified.lines
        line, h = _line(self.verified.last_hash, seq, e, self.keeper)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.verified.last_hash, self.verified.lines = h, seq + 1
        self._write_head()

    def _write_head(self) -> None:
        key = self.keeper.public_key_raw
        count, last = self.verified.lines, self.verified.last_hash
        obj = {
            "count": count,
            "hash": last,
            "keeper_key": key.hex(),
            "sig": self.keeper.sign(head_bytes(count, last, key)).hex(),
        }
        where = head_path(self.path)
        tmp = where.with_name(where.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(obj).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, where)


# --- summaries -----------------------------------------------------------------------------------------------
def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def earnings(entries: Iterable[SignedReceipt], me: str) -> dict[str, Any]:
    """What ``me`` earned: countersigned receipts for ``me``, by job, by day (UTC) and in total, in dollars (each
    receipt once: ``collect.unique``). Nothing of its own jobs: an owner does not pay its own device
    (``receipts.billed``; a ledger from before that rule may hold such receipts)."""
    entries = unique(entries)
    by_job: dict[str, float] = defaultdict(float)
    by_day: dict[str, float] = defaultdict(float)
    seconds = flops = 0.0
    count = 0
    for s in entries:
        r = s.receipt
        if r.device != me or not s.countersigned or not billed(r.owner, r.device):
            continue
        by_job[r.job_id] += r.usd
        by_day[_day(r.issued_at)] += r.usd
        seconds += r.device_seconds
        flops += r.flops
        count += 1
    return {
        "device": me,
        "receipts": count,
        "device_hours": seconds / 3600.0,
        "flops": flops,
        "by_job": dict(sorted(by_job.items())),
        "by_day": dict(sorted(by_day.items())),
        "total_usd": sum(by_job.values()),
    }


@dataclass(frozen=True)
class JobReceipts:
    """What a daemon's ledger holds of one job it took part in: the job's owner, the receipts for this device's own
    work that it countersigned, what they pay, and the last step any of the job's receipts (its own, or as the
    owner every device's) reaches."""

    owner: str
    receipts: int
    earned_usd: float
    last_step: int


def job_receipts(entries: Iterable[SignedReceipt], me: str) -> dict[str, JobReceipts]:
    """The jobs ``me`` holds receipts for (as their device or their owner), each receipt once: what a restarted
    daemon lists beside the jobs it still holds (``arceusd.jobs.record.known``)."""
    owners: dict[str, str] = {}
    counts: dict[str, int] = defaultdict(int)
    earned: dict[str, float] = defaultdict(float)
    last: dict[str, int] = defaultdict(int)
    for s in unique(entries):
        r = s.receipt
        if me not in (r.device, r.owner):
            continue
        owners[r.job_id] = r.owner
        last[r.job_id] = max(last[r.job_id], r.step_to)
        if r.device == me and s.countersigned and billed(r.owner, r.device):
            counts[r.job_id] += 1
            earned[r.job_id] += r.usd
    return {job: JobReceipts(owner, counts[job], earned[job], last[job]) for job, owner in sorted(owners.items())}


def bill(entries: Iterable[SignedReceipt], job_id: str) -> dict[str, Any]:
    """What the job's owner owes: its countersigned receipts by device (receipts a device did not countersign
    are listed apart and not owed; so are the owner's own device's, ``own_device_receipts``: it is not billed to
    its owner, ``receipts.billed``, though a ledger from before that rule may hold such receipts). Each receipt
    counts once (``collect.unique``): the owner's ledger can hold the leader's copy and the device's
    countersigned one."""
    entries = unique(entries)
    by_device: dict[str, float] = defaultdict(float)
    unaccepted = own = 0
    seconds = 0.0
    owner = ""
    for s in entries:
        r = s.receipt
        if r.job_id != job_id:
            continue
        owner = r.owner
        if not billed(r.owner, r.device):
            own += 1
            continue
        if not s.countersigned:
            unaccepted += 1
            continue
        by_device[r.device] += r.usd
        seconds += r.device_seconds
    return {
        "job_id": job_id,
        "owner": owner,
        "by_device": dict(sorted(by_device.items())),
        "device_hours": seconds / 3600.0,
        "total_usd": sum(by_device.values()),
        "unaccepted_receipts": unaccepted,
        "own_device_receipts": own,
    }
