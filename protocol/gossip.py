"""Wire messages of the SWIM driver and the peer handshake, mapped one-to-one onto the membership core's events.

Ids 50-59 (append-only, see the table in :mod:`protocol.messages`):

==== ================ ========== =====================================================================
id   type             max_size   meaning
==== ================ ========== =====================================================================
50   GossipUpdate     4 KiB      one member-state claim, signed by its ``origin`` (ALIVE/LEFT: the subject)
51   SwimPing         64 KiB     direct probe (the unary call's response is the SwimAck)
52   SwimAck          64 KiB     probe answer, same ``seq``
53   SwimNack         1 KiB      Lifeguard nack: an indirect probe of ``target`` timed out
54   SwimPingReq      64 KiB     probe ``target`` on the sender's behalf (response: SwimAck or SwimNack)
55   SwimGossip       64 KiB     gossip only
56   SwimPushPull     4 MiB      full-state exchange (response: the receiver's full state)
57   PeerHello        4 KiB      self-certifying handshake: the sender's key, id, address and device summary
==== ================ ========== =====================================================================

``GossipUpdate.signature`` covers :data:`UPDATE_TAG` + the codec encoding of the update with an empty
signature; ``PeerHello.signature`` likewise with :data:`HELLO_TAG`. Both encodings are deterministic.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from protocol import codec
from protocol.messages import message

UPDATE_TAG = b"arceus/gossip-update/v1\x00"
HELLO_TAG = b"arceus/peer-hello/v1\x00"
_ID = {"max_len": 64}


class UpdateKind(enum.IntEnum):
    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@message(50, max_size=4096)
@dataclass(frozen=True)
class GossipUpdate:
    kind: UpdateKind
    peer: str = field(metadata=_ID)
    incarnation: int
    origin: str = field(metadata=_ID)
    address: str = field(default="", metadata={"max_len": 300})
    public_key: bytes = field(default=b"", metadata={"max_len": 32})
    signature: bytes = field(default=b"", metadata={"max_len": 64})

    def signed_bytes(self) -> bytes:
        return UPDATE_TAG + codec.encode(replace(self, signature=b""))


@message(51, max_size=64 * 1024)
@dataclass(frozen=True)
class SwimPing:
    seq: int
    target: str = field(metadata=_ID)
    gossip: tuple[GossipUpdate, ...] = field(default=(), metadata={"max_len": 64})


@message(52, max_size=64 * 1024)
@dataclass(frozen=True)
class SwimAck:
    seq: int
    gossip: tuple[GossipUpdate, ...] = field(default=(), metadata={"max_len": 64})


@message(53, max_size=1024)
@dataclass(frozen=True)
class SwimNack:
    seq: int


@message(54, max_size=64 * 1024)
@dataclass(frozen=True)
class SwimPingReq:
    seq: int
    target: str = field(metadata=_ID)
    target_address: str = field(metadata={"max_len": 300})
    gossip: tuple[GossipUpdate, ...] = field(default=(), metadata={"max_len": 64})


@message(55, max_size=64 * 1024)
@dataclass(frozen=True)
class SwimGossip:
    gossip: tuple[GossipUpdate, ...] = field(metadata={"max_len": 64})


@message(56, max_size=4 * 1024 * 1024)
@dataclass(frozen=True)
class SwimPushPull:
    states: tuple[GossipUpdate, ...] = field(metadata={"max_len": 8192})
    is_reply: bool = False


@message(57, max_size=4096)
@dataclass(frozen=True)
class PeerHello:
    peer_id: str = field(metadata=_ID)
    public_key: bytes = field(metadata={"max_len": 32})
    address: str = field(metadata={"max_len": 300})
    timestamp_ms: int
    boot_id: int
    device: str = field(default="", metadata={"max_len": 200})
    signature: bytes = field(default=b"", metadata={"max_len": 64})

    def signed_bytes(self) -> bytes:
        return HELLO_TAG + codec.encode(replace(self, signature=b""))
