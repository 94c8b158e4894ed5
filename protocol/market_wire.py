"""Wire messages of the marketplace (ids 90-94, append-only).

==== ================ ========== =====================================================================
id   type             max_size   meaning
==== ================ ========== =====================================================================
90   ReceiptOffer     8 KiB      leader -> device: a receipt for committed work (canonical body, the leader's
                                 raw public key and signature; ``arceusd.market.receipts``), to countersign, and
                                 the job owner's authorisation of a leader (``arceusd.market.authority``: the
                                 owner's names its standby, a standby's names itself), or empty
91   ReceiptReply     1 KiB      device -> leader: its raw public key and countersignature, or an empty
                                 signature and the reason it refused
92   ReceiptsRequest  1 KiB      a job's owner -> a device or leader: the receipts for that job it keeps, from
                                 index ``start`` of that list (:data:`RECEIPTS_PER_BATCH` at a time)
93   ReceiptEntry     8 KiB      one signed receipt as a ledger keeps it (nested only)
94   ReceiptBatch     160 KiB    the answer: up to :data:`RECEIPTS_PER_BATCH` entries, whether more follow, or
                                 an empty batch and the reason
==== ================ ========== =====================================================================

The owner checks every entry of a :class:`ReceiptBatch` (canonical body, its job, its owner, a leader of the job
the owner knows, both signatures) before it keeps it (``arceusd.market.collect``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import message


@message(90, max_size=8 * 1024)
@dataclass(frozen=True)
class ReceiptOffer:
    body: bytes = field(metadata={"max_len": 4096})
    leader_key: bytes = field(metadata={"max_len": 32})
    leader_sig: bytes = field(metadata={"max_len": 64})
    authority: bytes = field(default=b"", metadata={"max_len": 512})


@message(91, max_size=1024)
@dataclass(frozen=True)
class ReceiptReply:
    device_key: bytes = field(metadata={"max_len": 32})
    device_sig: bytes = field(metadata={"max_len": 64})
    reason: str = field(default="", metadata={"max_len": 300})


RECEIPTS_PER_BATCH = 32


@message(92, max_size=1024)
@dataclass(frozen=True)
class ReceiptsRequest:
    job_id: str = field(metadata={"max_len": 64})
    start: int = 0


@message(93, max_size=8 * 1024)
@dataclass(frozen=True)
class ReceiptEntry:
    body: bytes = field(metadata={"max_len": 4096})
    leader_key: bytes = field(metadata={"max_len": 32})
    leader_sig: bytes = field(metadata={"max_len": 64})
    device_key: bytes = field(default=b"", metadata={"max_len": 32})
    device_sig: bytes = field(default=b"", metadata={"max_len": 64})


@message(94, max_size=160 * 1024)
@dataclass(frozen=True)
class ReceiptBatch:
    job_id: str = field(metadata={"max_len": 64})
    entries: tuple[ReceiptEntry, ...] = field(default=(), metadata={"max_len": RECEIPTS_PER_BATCH})
    more: bool = False
    reason: str = field(default="", metadata={"max_len": 300})
