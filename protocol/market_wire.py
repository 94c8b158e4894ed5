"""Wire messages of the marketplace (ids 90-91, append-only).

==== ================ ========== =====================================================================
id   type             max_size   meaning
==== ================ ========== =====================================================================
90   ReceiptOffer     8 KiB      leader -> device: a receipt for committed work (canonical body, the leader's
                                 raw public key and signature; ``arceusd.market.receipts``), to countersign
91   ReceiptReply     1 KiB      device -> leader: its raw public key and countersignature, or an empty
                                 signature and the reason it refused
==== ================ ========== =====================================================================
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


@message(91, max_size=1024)
@dataclass(frozen=True)
class ReceiptReply:
    device_key: bytes = field(metadata={"max_len": 32})
    device_sig: bytes = field(metadata={"max_len": 64})
    reason: str = field(default="", metadata={"max_len": 300})
