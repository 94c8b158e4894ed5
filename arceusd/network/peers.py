"""The peer service: runs the SWIM membership core over the signed transport, and routes other peer messages.

Owns the keyring (peer id -> Ed25519 public key), the handshake, sealing/opening envelopes, the mapping between
the core's events/actions and the wire messages of :mod:`protocol.gossip`, and per-peer observations (round-trip
time, last heard, device summary) shown by ``arceusd peers`` / ``status``.

Trust: a peer enters the keyring only through a proof that it holds the key its id is derived from - a
:class:`~protocol.gossip.PeerHello` it signed, or an ALIVE update it signed that reached us by gossip. Envelopes
from senders not in the keyring are answered with ``U`` ("say hello first") and nothing in them is decoded.
Every gossip update is signed by its origin (ALIVE and LEFT by their subject) and verified before the core sees it.

Unary framing on the transport's ``Call``: ``H`` + PeerHello, ``E`` + envelope; answers ``H``/``E`` likewise,
``U`` (unknown sender), or empty (nothing to say / rejected). Answers to requests (Ack for Ping, Ack/Nack for
PingReq, the reply PushPull) travel as the call's response: the core emits them as ``Send*`` actions, which the
driver hands to the waiting inbound call instead of opening a new one.

Peers are strangers: the keyring holds the keys of table members plus at most ``MAX_UNVERIFIED_KEYS`` keys of
peers that only said hello (least recently used evicted; a member's key is never evicted); membership messages
are rate-limited per authenticated sender (:mod:`.membership.ratelimit`); a send that fails for any reason is
logged and counted, never fatal; the core's own drops (:mod:`.membership.guard`) and ours are counted and shown
under ``dropped`` in ``arceusd status --json``.

Other services (election, jobs) register message handlers with :meth:`PeerService.register` and send with
:meth:`PeerService.request`; they all share the keyring, replay window and counters.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from arceusd.base.identity import Identity, peer_id_from_public_key, verify_signature
from arceusd.membership.config import MembershipConfig
from arceusd.membership.events import (
    AckReceived,
    Action,
    DuplicateIdentity,
    Event,
    GossipReceived,
    Join,
    Leave,
    MemberChanged,
    MemberState,
    NackReceived,
    PingReceived,
    PingReqReceived,
    PushPullReceived,
    SendAck,
    SendGossip,
    SendNack,
    SendPing,
    SendPingReq,
    SendPushPull,
    Tick,
    Update,
)
from arceusd.membership.events import UpdateKind as CoreKind
from arceusd.membership.ratelimit import RateLimiter
from arceusd.membership.swim import Membership
from protocol import codec
from protocol.envelope import NO_JOB, Header, open_envelope, seal_message
from protocol.errors import RemoteProtocolError
from protocol.gossip import (
    GossipUpdate,
    PeerHello,
    SwimAck,
    SwimGossip,
    SwimNack,
    SwimPing,
    SwimPingReq,
    SwimPushPull,
    UpdateKind,
)
from protocol.messages import type_id_of
from protocol.replay import ReplayGuard

log = logging.getLogger(__name__)

M = TypeVar("M")
MessageHandler = Callable[[Header, Any], Awaitable[object | None]]
HELLO_MAX_SKEW_MS = 10 * 60 * 1000
#: Non-membership messages (jobs, elections) handled per authenticated sender per second (twice that in a burst).
OTHER_RATE = 500.0
MAX_UNVERIFIED_KEYS = 256
_SWIM_MESSAGES = (SwimPing, SwimPingReq, SwimGossip, SwimPushPull)
_SWIM_TYPE_IDS = frozenset(type_id_of(cls) for cls in _SWIM_MESSAGES)
_KIND_TO_WIRE = {
    CoreKind.ALIVE: UpdateKind.ALIVE,
    CoreKind.SUSPECT: UpdateKind.SUSPECT,
    CoreKind.DEAD: UpdateKind.DEAD,
    CoreKind.LEFT: UpdateKind.LEFT,
}
_KIND_FROM_WIRE = {v: k for k, v in _KIND_TO_WIRE.items()}


class UnaryTransport(Protocol):
    """What the peer service needs from a transport (the gRPC one and the in-memory twin both fit)."""

    async def call(self, address: str, payload: bytes, timeout: float) -> bytes: ...


@dataclass
class _Slot:
    event: trio.Event = field(default_factory=trio.Event)
    value: object | None = None


@dataclass
class PeerInfo:
    """What we observed about a peer (not gossiped; our own measurements)."""

    rtt_ms: float | None = None
    last_heard: float | None = None
    device: str = ""
    boot_id: int | None = None


def wall_ms() -> int:
    return int(time.time() * 1000)


class PeerService:
    def __init__(
        self,
        identity: Identity,
        transport: UnaryTransport,
        config: MembershipConfig,
        address: str,
        boot_id: int,
        device: str = "",
        seed: int | None = None,
        *,
        active: bool = True,
    ) -> None:
        """``active=False``: not a member yet (see :meth:`activate`); a daemon activates once it is started."""
        self.identity = identity
        self.transport = transport
        self.config = config
        self.address = address
        self.boot_id = boot_id
        self.device = device
        self.keyring: dict[str, bytes] = {identity.peer_id: identity.public_key_raw}
        self.info: dict[str, PeerInfo] = {}
        self.rejected: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.bytes_sent = 0
        self.duplicates: list[str] = []
        self.listeners: list[Callable[[MemberChanged], None]] = []
        self._handlers: dict[type, MessageHandler] = {}
        self._signatures: OrderedDict[Update, bytes] = OrderedDict()
        self._replies: dict[tuple[str, str, int], _Slot] = {}
        self._seq = itertools.count(1)
        self._replay = ReplayGuard()
        self._wakeup = trio.Event()
        self._active = trio.Event()
        self._early_joins: list[str] = []  # join() before activate(), bounded
        if active:
            self._active.set()
        self._nursery: trio.Nursery | None = None
        self._hello_addresses: OrderedDict[str, str] = OrderedDict()
        self._unverified: OrderedDict[str, None] = OrderedDict()  # keyring entries of non-members, LRU
        self.dropped: Counter[str] = Counter()
        self.send_failures: Counter[str] = Counter()
        # Honest peers send us at most a few messages per gossip and probe interval; allow five of each per
        # second (at least 50 a second), two seconds of it in a burst.
        rate = max(50.0, 5 / config.gossip_interval + 5 / config.probe_interval)
        self._limiter = RateLimiter(rate, 2 * rate)
        # Every other message (jobs, elections) per authenticated sender: a member's reports, shard chunks and
        # echoes stay far below this; one key cannot make us handle more (the transport bounds each source).
        self._other_limiter = RateLimiter(OTHER_RATE, 2 * OTHER_RATE)
        rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "big"))
        self.membership = Membership(config, identity.peer_id, address, identity.public_key_raw, rng, self.now())

    # ------------------------------------------------------------------------------------------ running
    @staticmethod
    def now() -> float:
        return trio.current_time()

    def activate(self) -> None:
        """Become a member: answer membership messages, probe, gossip and contact the seeds from now on.

        A daemon calls this once all its services are started. Before, it is busy starting them (measured: 0.1 s
        alone, 0.3 s with five daemons starting on two cores) and a member that busy answers probes late: peers
        that joined it then suspected it, and its own probes, sent late, suspected them. Until then membership
        messages get no answer (the senders' seed loops and joins retry) and our timers do not run."""
        if not self._active.is_set():
            self._active.set()
            for address in self._early_joins:
                self.join(address)
            self._early_joins.clear()
            self._wakeup.set()

    @property
    def active(self) -> bool:
        return self._active.is_set()

    async def run(
        self, seeds: tuple[str, ...] = (), *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Drive the core's timers until cancelled; keep contacting ``seeds`` while we know nobody.

        Until :meth:`activate`, it waits (``task_status`` is reported at once)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._active.wait()
            nursery.start_soon(self._seed_loop, seeds)
            while True:
                with trio.move_on_at(self.membership.next_deadline()):
                    await self._wakeup.wait()
                self.feed(Tick())
                # feed() sets the event (an event fed from elsewhere may bring a deadline forward); replace it
                # only after our own Tick, or the next wait returns at once and the loop spins, using a core.
                self._wakeup = trio.Event()

    async def _seed_loop(self, seeds: tuple[str, ...]) -> None:
        delay = max(0.2, self.config.probe_interval)
        while seeds:
            if len(self.membership.live_peers()) <= 1:
                for seed in seeds:
                    if seed != self.address:
                        self.join(seed)
            await trio.sleep(delay)
            delay = min(delay * 2, 10 * self.config.probe_interval)

    def join(self, address: str) -> None:
        """Contact ``address`` (a seed or an mDNS announcement) with a full-state push/pull (once active)."""
        if not self._active.is_set():
            if address not in self._early_joins and len(self._early_joins) < 64:
                self._early_joins.append(address)
            return
        self.feed(Join(address))

    async def leave(self, timeout: float = 2.0) -> None:
        """Gossip LEFT to every live member and wait (bounded) until those messages went out."""
        actions = self.membership.handle(Leave(), self.now())
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for action in actions:
                    if isinstance(action, SendGossip | SendPing | SendPushPull):
                        nursery.start_soon(self._guarded_send, action)

    def feed(self, event: Event) -> None:
        """Hand ``event`` to the core and carry out its actions."""
        for action in self.membership.handle(event, self.now()):
            self._dispatch(action)
        self._wakeup.set()

    def _dispatch(self, action: Action) -> None:
        if isinstance(action, MemberChanged):
            state = action.state.value if action.state else "forgotten"
            log.info("peer %s is now %s (incarnation %d)", action.peer[:12], state, action.incarnation)
            if action.state is MemberState.ALIVE and action.public_key:
                self.keyring.setdefault(action.peer, action.public_key)
                self._unverified.pop(action.peer, None)
                if action.previous is None and self._nursery is not None:
                    self._nursery.start_soon(self._introduce, action.peer, action.address)
            elif action.state is None and action.peer in self.keyring:
                self._note_unverified(action.peer)  # forgotten: its key becomes evictable
            for listener in self.listeners:
                listener(action)
            return
        if isinstance(action, DuplicateIdentity):
            message = (
                f"another daemon at {action.their_address} uses our peer id {action.peer} "
                "(a copied state directory?); give one of them a fresh identity"
            )
            if message not in self.duplicates:
                self.duplicates.append(message)
                log.error("%s", message)
            return
        if isinstance(action, SendAck | SendNack):
            self._fill(("r", action.to, action.seq), action)
            return
        if isinstance(action, SendPushPull) and action.is_reply:
            self._fill(("pp", action.to, 0), action)
            return
        assert self._nursery is not None, "PeerService.run must be running before messages flow"
        self._nursery.start_soon(self._guarded_send, action)

    def _fill(self, key: tuple[str, str, int], value: object) -> None:
        slot = self._replies.get(key)
        if slot is not None and not slot.event.is_set():
            slot.value = value
            slot.event.set()

    # ------------------------------------------------------------------------------------------ outbound
    async def _guarded_send(self, action: Action) -> None:
        """Carry out one send; whatever goes wrong is logged and counted, never fatal to the membership nursery."""
        try:
            await self._send_action(action)
        except Exception as exc:
            self.send_failures[type(action).__name__] += 1
            log.warning("sending %s failed: %s: %s", type(action).__name__, type(exc).__name__, exc)

    async def _send_action(self, action: Action) -> None:
        if isinstance(action, SendPing):
            t0 = time.monotonic()
            ping = SwimPing(action.seq, action.to, self._wire(action.gossip))
            reply = await self.request(action.address, action.to, ping, timeout=self.config.probe_timeout * 2)
            if isinstance(reply, SwimAck) and reply.seq == action.seq:
                self.info.setdefault(action.to, PeerInfo()).rtt_ms = (time.monotonic() - t0) * 1000
                self.feed(AckReceived(action.to, reply.seq, self._core(reply.gossip)))
        elif isinstance(action, SendPingReq):
            msg = SwimPingReq(action.seq, action.target, action.target_address, self._wire(action.gossip))
            reply = await self.request(action.address, action.to, msg, timeout=self.config.probe_interval * 2)
            if isinstance(reply, SwimAck):
                self.feed(AckReceived(action.to, reply.seq, self._core(reply.gossip)))
            elif isinstance(reply, SwimNack):
                self.feed(NackReceived(action.to, reply.seq))
        elif isinstance(action, SendGossip):
            await self.request(action.address, action.to, SwimGossip(self._wire(action.gossip)), timeout=2.0)
        elif isinstance(action, SendPushPull):
            sender = action.to or None
            reply = await self.request(action.address, sender, SwimPushPull(self._wire(action.states)), timeout=5.0)
            if isinstance(reply, SwimPushPull):
                peer = action.to or self._peer_at(action.address)
                if peer:
                    self.feed(PushPullReceived(peer, action.address, self._core(reply.states), True))

    async def _introduce(self, peer: str, address: str) -> None:
        """Say hello to a member new to our table, before our first probe of it.

        Our first probe would otherwise open the connection (gRPC's TCP and HTTP/2 set-up: several more
        hand-offs between threads and processes) and, when the member does not know our key yet, go through
        ``U`` -> hello -> retry: three round trips inside one probe timeout. Measured with five ``local``
        daemons started together on two cores: first probes took 130-320 ms (the timeout is 50 ms, 100 ms with
        the indirect probes) and suspected healthy members; later ones took 4-10 ms."""
        hello = await self.hello(address, timeout=max(1.0, 10 * self.config.probe_interval))
        if hello is not None and hello.peer_id != peer:
            self.rejected["hello_other_peer"] += 1

    def set_device(self, device: str) -> None:
        """This device's summary changed (it was measured: its GPU is known now): keep it for later hellos and
        say hello again to every alive member (at most :data:`MAX_UNVERIFIED_KEYS`), so their ``peers`` show it
        (a hello is otherwise sent once, to a member new to the table)."""
        if device == self.device:
            return
        self.device = device
        if self._nursery is None:
            return
        members = sorted((p, a) for p, a in self.alive_peers().items() if p != self.identity.peer_id)
        for _peer, address in members[:MAX_UNVERIFIED_KEYS]:
            self._nursery.start_soon(self.hello, address)

    def _peer_at(self, address: str) -> str | None:
        return self._hello_addresses.get(address)

    async def hello(self, address: str, timeout: float = 5.0) -> PeerHello | None:
        """Exchange PeerHellos with ``address``; on success the peer's key is in the keyring."""
        request = b"H" + codec.encode(self._own_hello())
        try:
            response = await self.transport.call(address, request, timeout)
        except Exception as exc:
            log.debug("hello to %s failed: %s", address, exc)
            return None
        if response[:1] != b"H":
            self.rejected["hello_no_answer"] += 1
            return None
        hello = self._accept_hello(response[1:])
        if hello is not None:
            self._hello_addresses[address] = hello.peer_id
            self._hello_addresses.move_to_end(address)
            while len(self._hello_addresses) > MAX_UNVERIFIED_KEYS:
                self._hello_addresses.popitem(last=False)
        return hello

    async def request(
        self,
        address: str,
        peer: str | None,
        msg: object,
        timeout: float,
        *,
        job_id: str | None = None,
        term: int = 0,
        epoch: int = 0,
    ) -> object | None:
        """Send ``msg`` sealed to ``peer`` at ``address``; return its decoded answer, or None (no answer/lost)."""
        if peer is None or peer not in self.keyring:
            hello = await self.hello(address, timeout)
            if hello is None or (peer is not None and hello.peer_id != peer):
                return None
            peer = hello.peer_id
        for _attempt in range(2):
            frame = b"E" + seal_message(
                self.identity,
                msg,
                boot_id=self.boot_id,
                seq=next(self._seq),
                timestamp_ms=wall_ms(),
                recipient=peer,
                job_id=job_id or NO_JOB,
                term=term,
                epoch=epoch,
            )
            self.sent[type(msg).__name__] += 1
            self.bytes_sent += len(frame)
            try:
                response = await self.transport.call(address, frame, timeout)
            except Exception as exc:
                log.debug("%s to %s failed: %s", type(msg).__name__, address, exc)
                return None
            if response[:1] == b"U":
                if await self.hello(address, timeout) is None:
                    return None
                continue
            if response[:1] != b"E":
                return None
            try:
                header, answer = self._open(response[1:])
            except RemoteProtocolError as exc:
                self.rejected[exc.reason] += 1
                return None
            if header.sender != peer:
                self.rejected["answer_from_other_peer"] += 1
                return None
            return answer
        return None

    # ------------------------------------------------------------------------------------------ inbound
    async def handle_call(self, request: bytes) -> bytes:
        """The transport's unary handler."""
        kind = request[:1]
        if kind == b"H":
            hello = self._accept_hello(request[1:])
            return b"H" + codec.encode(self._own_hello()) if hello is not None else b""
        if kind != b"E":
            self.rejected["bad_frame_kind"] += 1
            return b""
        try:
            header, payload = self._open_envelope(request[1:])
        except RemoteProtocolError as exc:
            if exc.reason == "unknown_sender":
                return b"U"
            self.rejected[exc.reason] += 1
            log.debug("rejected a message: %s", exc)
            return b""
        # The sender's limits apply before its payload is decoded (issue 29): decoding is work done for it.
        swim = header.msg_type in _SWIM_TYPE_IDS
        if swim and not self._active.is_set():
            self.dropped["not_started"] += 1
            return b""
        if swim and not self._limiter.allow(header.sender, self.now()):
            self.dropped["rate_limited"] += 1
            return b""
        if not swim and not self._other_limiter.allow(header.sender, self.now()):
            self.dropped["rate_limited_other"] += 1
            return b""
        try:
            msg = codec.decode(header.msg_type, payload)
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
            log.debug("rejected a message from %s: %s", header.sender, exc)
            return b""
        answer = await self._on_message(header, msg)
        if answer is None:
            return b""
        try:
            return b"E" + seal_message(
                self.identity,
                answer,
                boot_id=self.boot_id,
                seq=next(self._seq),
                timestamp_ms=wall_ms(),
                recipient=header.sender,
                job_id=header.job_id,
                term=header.term,
                epoch=header.epoch,
            )
        except Exception as exc:  # an answer we cannot encode is our bug; the caller gets no answer, we go on
            self.send_failures[type(answer).__name__] += 1
            log.warning("could not encode a %s answer: %s", type(answer).__name__, exc)
            return b""

    def _open(self, frame: bytes) -> tuple[Header, object]:
        header, payload = self._open_envelope(frame)
        return header, codec.decode(header.msg_type, payload)

    def _open_envelope(self, frame: bytes) -> tuple[Header, memoryview]:
        """Authenticate a frame (signature, recipient, replay); its payload is not decoded yet."""
        header, payload = open_envelope(
            frame,
            lookup_key=self.keyring.get,
            expect_recipient=self.identity.peer_id,
            expect_job=None,
            replay_guard=self._replay,
            now_ms=wall_ms(),
            accept_broadcast=False,
        )
        info = self.info.setdefault(header.sender, PeerInfo())
        info.last_heard = time.monotonic()
        return header, payload

    async def _on_message(self, header: Header, msg: object) -> object | None:
        sender = header.sender
        if isinstance(msg, SwimPing):
            event = PingReceived(sender, "", msg.seq, msg.target, self._core(msg.gossip))
            return await self._await_reply(("r", sender, msg.seq), event, 0.0)
        if isinstance(msg, SwimPingReq):
            relay = PingReqReceived(sender, "", msg.seq, msg.target, msg.target_address, self._core(msg.gossip))
            return await self._await_reply(("r", sender, msg.seq), relay, self.config.probe_timeout * 2)
        if isinstance(msg, SwimGossip):
            self.feed(GossipReceived(sender, self._core(msg.gossip)))
            return None
        if isinstance(msg, SwimPushPull):
            sync = PushPullReceived(sender, "", self._core(msg.states), msg.is_reply)
            return await self._await_reply(("pp", sender, 0), sync, 0.0)
        handler = self._handlers.get(type(msg))
        if handler is None:
            self.rejected["no_handler"] += 1
            return None
        return await handler(header, msg)

    async def _await_reply(self, key: tuple[str, str, int], event: Event, wait: float) -> object | None:
        slot = self._replies[key] = _Slot()
        try:
            self.feed(event)
            if not slot.event.is_set():
                with trio.move_on_after(wait):
                    await slot.event.wait()
        finally:
            self._replies.pop(key, None)
        value = slot.value
        if isinstance(value, SendAck):
            return SwimAck(value.seq, self._wire(value.gossip))
        if isinstance(value, SendNack):
            return SwimNack(value.seq)
        if isinstance(value, SendPushPull):
            return SwimPushPull(self._wire(value.states), True)
        return None

    def register(self, cls: type[M], handler: Callable[[Header, M], Awaitable[object | None]]) -> None:
        """Route inbound messages of type ``cls`` to ``handler``; its return value is sent back as the answer."""
        self._handlers[cls] = handler

    # ------------------------------------------------------------------------------------------ hello
    def _own_hello(self) -> PeerHello:
        hello = PeerHello(
            self.identity.peer_id, self.identity.public_key_raw, self.address, wall_ms(), self.boot_id, self.device
        )
        return PeerHello(**{**hello.__dict__, "signature": self.identity.sign(hello.signed_bytes())})

    def _accept_hello(self, data: bytes) -> PeerHello | None:
        try:
            hello = codec.decode_as(PeerHello, data)
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
            return None
        if len(hello.public_key) != 32 or peer_id_from_public_key(hello.public_key) != hello.peer_id:
            self.rejected["hello_id_mismatch"] += 1
            return None
        if abs(hello.timestamp_ms - wall_ms()) > HELLO_MAX_SKEW_MS:
            self.rejected["hello_stale"] += 1
            return None
        if not verify_signature(hello.public_key, hello.signature, hello.signed_bytes()):
            self.rejected["hello_bad_signature"] += 1
            return None
        if hello.peer_id == self.identity.peer_id:
            if hello.public_key == self.identity.public_key_raw and hello.boot_id != self.boot_id:
                message = f"another daemon at {hello.address} uses our peer id (a copied state directory?)"
                if message not in self.duplicates:
                    self.duplicates.append(message)
                    log.error("%s", message)
            return None
        if self.keyring.get(hello.peer_id) != hello.public_key:
            self.keyring[hello.peer_id] = hello.public_key
        if self.membership.state_of(hello.peer_id) is None:
            self._note_unverified(hello.peer_id)
        info = self.info.setdefault(hello.peer_id, PeerInfo())
        info.device, info.boot_id = hello.device, hello.boot_id
        return hello

    def _note_unverified(self, peer: str) -> None:
        """``peer``'s key is in the keyring but it is not a member: keep at most MAX_UNVERIFIED_KEYS such keys."""
        self._unverified[peer] = None
        self._unverified.move_to_end(peer)
        while len(self._unverified) > MAX_UNVERIFIED_KEYS:
            old, _ = self._unverified.popitem(last=False)
            if self.membership.state_of(old) is None and old != self.identity.peer_id:
                self.keyring.pop(old, None)
                self.info.pop(old, None)

    # ------------------------------------------------------------------------------------------ gossip
    def _wire(self, updates: tuple[Update, ...]) -> tuple[GossipUpdate, ...]:
        out = []
        for u in updates:
            sig = self._signatures.get(u)
            unsigned = GossipUpdate(_KIND_TO_WIRE[u.kind], u.peer, u.incarnation, u.origin, u.address, u.public_key)
            if sig is None:
                if u.origin != self.identity.peer_id:
                    continue  # we cannot vouch for someone else's claim without their signature
                sig = self.identity.sign(unsigned.signed_bytes())
                self._remember(u, sig)
            out.append(GossipUpdate(**{**unsigned.__dict__, "signature": sig}))
        return tuple(out)

    def _core(self, updates: tuple[GossipUpdate, ...]) -> tuple[Update, ...]:
        out = []
        for g in updates:
            self_made = g.kind in (UpdateKind.ALIVE, UpdateKind.LEFT)
            if self_made and g.origin != g.peer:
                self.rejected["update_not_self_signed"] += 1
                continue
            if g.kind is UpdateKind.ALIVE:
                if len(g.public_key) != 32 or peer_id_from_public_key(g.public_key) != g.peer:
                    self.rejected["update_key_mismatch"] += 1
                    continue
                key: bytes | None = g.public_key
            else:
                key = self.keyring.get(g.origin)
            if key is None:
                self.rejected["update_unknown_origin"] += 1
                continue
            if not verify_signature(key, g.signature, g.signed_bytes()):
                self.rejected["update_bad_signature"] += 1
                continue
            update = Update(_KIND_FROM_WIRE[g.kind], g.peer, g.incarnation, g.origin, g.address, g.public_key)
            self._remember(update, g.signature)
            out.append(update)
        return tuple(out)

    def _remember(self, update: Update, signature: bytes) -> None:
        self._signatures[update] = signature
        self._signatures.move_to_end(update)
        while len(self._signatures) > 20_000:
            self._signatures.popitem(last=False)

    # ------------------------------------------------------------------------------------------ status
    def peers(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for peer, member in sorted(self.membership.members.items()):
            if peer == self.identity.peer_id:
                continue
            info = self.info.get(peer, PeerInfo())
            out.append(
                {
                    "peer_id": peer,
                    "state": member.state.value,
                    "incarnation": member.incarnation,
                    "address": member.address,
                    "rtt_ms": None if info.rtt_ms is None else round(info.rtt_ms, 3),
                    "last_heard_s": None if info.last_heard is None else round(now - info.last_heard, 3),
                    "device": info.device,
                }
            )
        return out

    def alive_peers(self) -> dict[str, str]:
        """peer id -> address of every member we consider alive (ourselves included)."""
        return {p: m.address for p, m in self.membership.members.items() if m.state is MemberState.ALIVE}

    def answering_peers(self) -> list[str]:
        """Every member not declared dead or left, the alive ones first: who may still answer a request (a
        suspect on a loaded machine often does)."""
        live = (MemberState.ALIVE, MemberState.SUSPECT)
        found = [(m.state is not MemberState.ALIVE, p) for p, m in self.membership.members.items() if m.state in live]
        return [p for _, p in sorted(found)]

    def drops(self) -> dict[str, int]:
        """Every message or update we dropped, by reason (the ``dropped.membership`` section of ``status``)."""
        out: Counter[str] = Counter()
        out.update(self.rejected)
        out.update(self.dropped)
        out.update(self.membership.dropped)
        out.update({f"send_failed_{k}": v for k, v in self.send_failures.items()})
        return dict(sorted(out.items()))

    def counters(self) -> dict[str, Any]:
        return {
            "rejected": dict(self.rejected),
            "sent": dict(self.sent),
            "bytes_sent": self.bytes_sent,
            "duplicates": list(self.duplicates),
            "incarnation": self.membership.incarnation,
            "health": self.membership.health_score,
        }
