"""The membership core's vocabulary: gossip updates, input events and output actions (all frozen dataclasses).

Owns: :class:`MemberState`, :class:`UpdateKind`, :class:`Update` (one gossiped claim about one member), the
input events the driver feeds to :meth:`arceusd.membership.swim.Membership.handle`, the actions it returns,
and :func:`estimated_size`, the byte-size model used to fill packets (and by the benchmark).

The core never imports ``protocol/``: a driver maps ``Send*`` actions to wire messages and transport calls,
and received wire messages back to ``*Received`` events. Addresses and public keys are opaque to the core.

Size model (bytes, close to a msgpack encoding): an update is ``8`` (kind, incarnation, framing) + peer id +
origin + address + public key; a packet is ``24`` (type, seq, framing) + peer ids/addresses it names + its
updates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

PeerId = str
Address = str


class MemberState(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


class UpdateKind(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class Update:
    """A claim about ``peer`` at ``incarnation`` made by ``origin``.

    ALIVE and LEFT are only made by the peer itself (the driver signs/verifies them with that peer's key);
    ``address`` and ``public_key`` are set on ALIVE updates and empty otherwise.
    """

    kind: UpdateKind
    peer: PeerId
    incarnation: int
    origin: PeerId
    address: Address = ""
    public_key: bytes = b""


Gossip = tuple[Update, ...]


# ---------------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: run whatever is due at ``now`` (the driver calls this at :meth:`next_deadline`)."""


@dataclass(frozen=True, slots=True)
class Join:
    """Contact a seed (from mDNS or the command line) with a push/pull full-state sync."""

    address: Address


@dataclass(frozen=True, slots=True)
class Leave:
    """Leave gracefully: 'left' is sent at once to every member we know; the core then goes quiet."""


@dataclass(frozen=True, slots=True)
class PingReceived:
    sender: PeerId
    reply_to: Address
    seq: int
    target: PeerId
    gossip: Gossip = ()


@dataclass(frozen=True, slots=True)
class AckReceived:
    sender: PeerId
    seq: int
    gossip: Gossip = ()


@dataclass(frozen=True, slots=True)
class NackReceived:
    sender: PeerId
    seq: int


@dataclass(frozen=True, slots=True)
class PingReqReceived:
    """``sender`` asks us to probe ``target`` and relay the ack (or a nack) under ``seq``."""

    sender: PeerId
    reply_to: Address
    seq: int
    target: PeerId
    target_address: Address
    gossip: Gossip = ()


@dataclass(frozen=True, slots=True)
class GossipReceived:
    sender: PeerId
    gossip: Gossip


@dataclass(frozen=True, slots=True)
class PushPullReceived:
    """A full-state sync. When ``is_reply`` is False the core answers with its own state."""

    sender: PeerId
    reply_to: Address
    states: Gossip
    is_reply: bool


Event = (
    Tick
    | Join
    | Leave
    | PingReceived
    | AckReceived
    | NackReceived
    | PingReqReceived
    | GossipReceived
    | PushPullReceived
)


# --------------------------------------------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class SendPing:
    to: PeerId
    address: Address
    seq: int
    gossip: Gossip = ()


@dataclass(frozen=True, slots=True)
class SendAck:
    to: PeerId
    address: Address
    seq: int
    gossip: Gossip = ()


@dataclass(frozen=True, slots=True)
class SendNack:
    to: PeerId
    address: Address
    seq: int


@dataclass(frozen=True, slots=True)
class SendPingReq:
    to: PeerId
    address: Address
    seq: int
    target: PeerId
    target_address: Address
    gossip: Gossip = ()


@dataclass(frozen=True, slots=True)
class SendGossip:
    to: PeerId
    address: Address
    gossip: Gossip


@dataclass(frozen=True, slots=True)
class SendPushPull:
    """``to`` is empty when contacting a seed known only by address."""

    to: PeerId
    address: Address
    states: Gossip
    is_reply: bool


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """Our view of ``peer`` changed. ``state`` None means the tombstone expired and the peer was forgotten."""

    peer: PeerId
    previous: MemberState | None
    state: MemberState | None
    incarnation: int
    address: Address
    public_key: bytes


@dataclass(frozen=True, slots=True)
class DuplicateIdentity:
    """Someone gossips an ALIVE for OUR peer id with another address/key: a copied state directory, most
    likely.

    Never merged. The core refutes once (so the cluster keeps our address); the driver should alert the user
    and decide whether to stop.
    """

    peer: PeerId
    incarnation: int
    our_address: Address
    our_public_key: bytes
    their_address: Address
    their_public_key: bytes


Send = SendPing | SendAck | SendNack | SendPingReq | SendGossip | SendPushPull
Action = Send | MemberChanged | DuplicateIdentity


# ------------------------------------------------------------------------------------------------ size model
UPDATE_OVERHEAD = 8
PACKET_OVERHEAD = 24


def update_size(update: Update) -> int:
    return UPDATE_OVERHEAD + len(update.peer) + len(update.origin) + len(update.address) + len(update.public_key)


def estimated_size(action: Send) -> int:
    """Bytes this send puts on the wire under the size model in the module docstring."""
    size = PACKET_OVERHEAD + len(action.to)
    if isinstance(action, SendPingReq):
        size += len(action.target) + len(action.target_address)
    if isinstance(action, SendPushPull):
        return size + sum(update_size(u) for u in action.states)
    if isinstance(action, SendNack):
        return size
    return size + sum(update_size(u) for u in action.gossip)
