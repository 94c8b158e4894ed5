"""Signed receipts for committed work: what the leader issues, what a device countersigns. Pure.

Owns: :class:`Receipt` (job, owner, leader, device, term, epoch, step range ``(step_from, step_to]``,
device-seconds, FLOPs under the plan, price per hour, issue time), its canonical encoding and signatures,
:class:`LeaderBook` (the leader's per-job record of what it has paid, from which receipts are issued) and
:func:`device_check` (what a device compares a receipt with before it countersigns).

Encoding: a msgpack map ``{field: value}`` in declaration order (``use_bin_type``, ``strict_types``), as
``protocol.codec`` encodes messages, so the bytes are deterministic and can be signed. Signatures are
Ed25519 (``arceusd.base.identity``) over domain-separated bytes: the leader signs ``LEADER_DOMAIN || body``, the
device signs ``DEVICE_DOMAIN || body || leader signature``. A signed receipt carries both raw public keys;
anyone checks that each key's peer id is the one named in the body and that each signature verifies.

Work is measured by the leader and bounded by the plan, never taken from the device's word:
- the job's owner pays the other devices: its own device, which trains in its own job, gets no receipt (it is
  not billed to its owner, and earns nothing from its own job);
- a receipt is only issued at a committed checkpoint, only to a device of the current plan whose shard of
  that step the leader copied and checked (``reported``), and only for steps after both what that device was
  already paid for and the step the current plan started from (:meth:`LeaderBook.issue`); a device that
  joined at step 40 cannot be paid for steps 0-40, one that reported no shard gets nothing;
- FLOPs = steps x the device's share of the model's FLOPs under the plan x the FLOPs of one step;
- device-seconds = the leader's own clock between the commits, at most :data:`PLAN_SLACK` x the plan's
  predicted step time per step;
- the price is the market price for the device's measured FLOP/s in the leader's view, at most the job's
  highest (``arceusd.market.needs.pay``: the rule the device was matched by).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

import msgpack

from arceusd.base.identity import Identity, peer_id_from_public_key, verify_signature

LEADER_DOMAIN = b"arceus-receipt-v1\x00"
DEVICE_DOMAIN = b"arceus-receipt-countersign-v1\x00"
PLAN_SLACK = 4.0
"""Device-seconds are at most this many times the plan's predicted step time, per step."""
MAX_BODY = 4096
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class ReceiptError(ValueError):
    """A receipt is malformed or does not verify; the message says which field or signature."""


@dataclass(frozen=True)
class Receipt:
    job_id: str
    owner: str
    leader: str
    device: str
    term: int
    epoch: int
    step_from: int
    step_to: int
    device_seconds: float
    flops: float
    price_per_hour: float
    issued_at: float

    @property
    def steps(self) -> int:
        return self.step_to - self.step_from

    @property
    def usd(self) -> float:
        return self.device_seconds / 3600.0 * self.price_per_hour

    def check(self) -> None:
        for name in ("job_id", "owner", "leader", "device"):
            if not _HEX32.match(getattr(self, name)):
                raise ReceiptError(f"receipt {name} must be 32 lowercase hex characters")
        if not (0 <= self.term < 2**62 and 0 <= self.epoch < 2**62 and 0 <= self.step_from < self.step_to < 2**62):
            raise ReceiptError(
                f"receipt term/epoch/steps out of range ({self.term}, {self.epoch}, {self.step_from}..{self.step_to})"
            )
        for name in ("device_seconds", "flops", "price_per_hour", "issued_at"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ReceiptError(f"receipt {name} must be a finite number >= 0, got {v}")


def encode(r: Receipt) -> bytes:
    """The canonical body: a msgpack map in declaration order."""
    r.check()
    body: bytes = msgpack.packb(
        {f.name: getattr(r, f.name) for f in fields(Receipt)}, use_bin_type=True, strict_types=True
    )
    return body


def decode(body: bytes) -> Receipt:
    """Read a body back, checking every field's exact type and range; :class:`ReceiptError` if anything is off."""
    if len(body) > MAX_BODY:
        raise ReceiptError(f"receipt body is {len(body)} bytes; at most {MAX_BODY}")
    try:
        data = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=64,
            max_bin_len=0,
            max_array_len=0,
            max_map_len=len(fields(Receipt)),
            max_ext_len=0,
        )
    except (ValueError, msgpack.UnpackException) as exc:
        raise ReceiptError(f"receipt body is not msgpack: {exc}") from None
    names = [f.name for f in fields(Receipt)]
    if not isinstance(data, dict) or list(data) != names:
        raise ReceiptError(f"receipt body must hold exactly the fields {names} in that order")
    values: dict[str, Any] = {}
    for f in fields(Receipt):
        v = data[f.name]
        want = {"str": str, "int": int, "float": float}[str(f.type)]
        if type(v) is not want:
            raise ReceiptError(f"receipt {f.name} must be {want.__name__}, got {type(v).__name__}")
        values[f.name] = v
    r = Receipt(**values)
    r.check()
    if encode(r) != body:
        raise ReceiptError("receipt body is not in canonical form")
    return r


@dataclass(frozen=True)
class SignedReceipt:
    receipt: Receipt
    leader_key: bytes
    leader_sig: bytes
    device_key: bytes = b""
    device_sig: bytes = b""

    @property
    def countersigned(self) -> bool:
        return bool(self.device_sig)

    def verify(self, require_device: bool = True) -> None:
        """Both keys name the body's peers and both signatures hold; :class:`ReceiptError` says which does not."""
        r = self.receipt
        body = encode(r)
        if _peer(self.leader_key) != r.leader:
            raise ReceiptError("the leader key is not the receipt's leader")
        if not verify_signature(self.leader_key, self.leader_sig, LEADER_DOMAIN + body):
            raise ReceiptError("the leader's signature does not verify")
        if not self.device_sig:
            if require_device:
                raise ReceiptError("the device has not countersigned")
            return
        if _peer(self.device_key) != r.device:
            raise ReceiptError("the device key is not the receipt's device")
        if not verify_signature(self.device_key, self.device_sig, DEVICE_DOMAIN + body + self.leader_sig):
            raise ReceiptError("the device's countersignature does not verify")


def _peer(key: bytes) -> str:
    try:
        return peer_id_from_public_key(key)
    except ValueError:
        return ""


def sign_leader(identity: Identity, r: Receipt) -> SignedReceipt:
    if identity.peer_id != r.leader:
        raise ReceiptError("only the receipt's leader signs it")
    return SignedReceipt(r, identity.public_key_raw, identity.sign(LEADER_DOMAIN + encode(r)))


def countersign(identity: Identity, signed: SignedReceipt) -> SignedReceipt:
    if identity.peer_id != signed.receipt.device:
        raise ReceiptError("only the receipt's device countersigns it")
    signed.verify(require_device=False)
    sig = identity.sign(DEVICE_DOMAIN + encode(signed.receipt) + signed.leader_sig)
    return replace(signed, device_key=identity.public_key_raw, device_sig=sig)


# --- the leader's side ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Commit:
    """A committed checkpoint as the leader saw it."""

    job_id: str
    owner: str
    term: int
    epoch: int
    step: int
    at: float
    """The leader's wall clock at the commit."""
    reported: frozenset[str]
    """Devices whose shard of ``step`` the leader copied and checked."""
    shares: dict[str, float]
    """Each plan device's share of the model's FLOPs (sums to 1)."""
    flops_per_step: float
    predicted_step_s: float
    prices: dict[str, float]
    """Each device's price per hour (the leader's market price, at most the job's highest)."""


def billed(owner: str, device: str) -> bool:
    """Whether a job's owner pays ``device`` for its work: every device but the owner's own."""
    return device != owner


def most_per_step_usd(c: Commit) -> float:
    """The most one step can cost under ``c``'s plan: every plan device paid its price for :data:`PLAN_SLACK` x the
    predicted step time (a receipt's seconds are capped there, :meth:`LeaderBook.issue`)."""
    price = sum(p for device, p in c.prices.items() if c.shares.get(device, 0.0) > 0 and billed(c.owner, device))
    return max(c.predicted_step_s, 0.0) * PLAN_SLACK * price / 3600.0


@dataclass
class LeaderBook:
    """What the leader has paid in one job: per device, the step it is paid up to and when that was; the
    plan epoch and the step it started from (``base``: the last commit before the epoch, which the plan
    resumed from or after)."""

    paid_to: dict[str, tuple[int, float]] = field(default_factory=dict)
    epoch: int = -1
    base: tuple[int, float] = (0, 0.0)
    last: tuple[int, float] = (0, 0.0)
    first: int = 0
    """The step the leader began from."""
    spent_usd: float = 0.0
    """What the receipts this book issued add up to (countersigned or not)."""

    def start(self, step: int, at: float) -> None:
        """The job's last committed step before the leader began (0 for a fresh job)."""
        self.last = (step, at)
        self.base = (step, at)
        self.first = step

    def per_step_usd(self) -> float:
        """Dollars per step of progress since the leader began (0 before its first commit)."""
        steps = self.last[0] - self.first
        return self.spent_usd / steps if steps > 0 else 0.0

    def spent_estimate(self) -> float:
        """What the job has cost: this book's receipts, and the steps before it began at the rate it measures (a
        leader that took over, or an owner restarted, does not hold every earlier leader's receipts)."""
        return self.spent_usd + self.per_step_usd() * self.first

    def issue(self, leader: str, c: Commit) -> list[Receipt]:
        """The receipts this commit owes (see the module docstring); updates the book."""
        if c.epoch != self.epoch:
            self.epoch, self.base = c.epoch, self.last
        out: list[Receipt] = []
        for device in sorted(c.reported):
            share = c.shares.get(device, 0.0)
            if share <= 0 or device not in c.prices:
                continue  # not in this plan: no work under it
            if not billed(c.owner, device):
                continue  # the owner's own device: not billed to the owner
            paid_step, paid_at = self.paid_to.get(device, (0, 0.0))
            from_step, from_at = max((paid_step, paid_at), self.base)
            if c.step <= from_step:
                continue
            steps = c.step - from_step
            seconds = min(max(0.0, c.at - from_at), steps * c.predicted_step_s * PLAN_SLACK)
            out.append(
                Receipt(
                    c.job_id,
                    c.owner,
                    leader,
                    device,
                    c.term,
                    c.epoch,
                    from_step,
                    c.step,
                    seconds,
                    steps * share * c.flops_per_step,
                    c.prices[device],
                    c.at,
                )
            )
            self.paid_to[device] = (c.step, c.at)
            self.spent_usd += out[-1].usd
        if c.step > self.last[0]:
            self.last = (c.step, c.at)
        return out


# --- the device's side ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceRecord:
    """What this device's own worker did in a job: its latest step, the plan epoch, since when it works for
    the job (wall clock), the whole model's FLOPs per step, and the lowest price its policy accepts."""

    job_id: str
    me: str
    epoch: int
    last_step: int
    since: float
    flops_per_step: float
    min_price_per_hour: float


def device_check(r: Receipt, rec: DeviceRecord, now: float) -> list[str]:
    """Why this device does not countersign ``r`` (empty: it does)."""
    out = []
    if r.job_id != rec.job_id or r.device != rec.me:
        out.append("not this device's receipt for this job")
    if r.epoch > rec.epoch:
        out.append(f"epoch {r.epoch} is newer than this device's {rec.epoch}")
    if r.step_to > rec.last_step:
        out.append(f"steps up to {r.step_to} but this device's worker reached {rec.last_step}")
    if r.flops > r.steps * rec.flops_per_step * (1 + 1e-9):
        out.append("more FLOPs than the whole model takes for those steps")
    if r.device_seconds > max(0.0, now - rec.since) + 1.0:
        out.append("more device-seconds than this device has worked for the job")
    if r.price_per_hour + 1e-12 < rec.min_price_per_hour:
        out.append(f"price ${r.price_per_hour:.4f}/h below this device's lowest ${rec.min_price_per_hour:.4f}/h")
    return out
