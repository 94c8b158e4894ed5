"""The SWIM + Lifeguard membership state machine: no I/O, no clock, no hidden randomness.

Owns :class:`Membership`. Shape (chosen over a functional ``apply(state, event, now)``): one object per local
member whose :meth:`Membership.handle` takes an input event and the current time and returns the actions to
carry out, in order; :meth:`Membership.next_deadline` says when to call ``handle(Tick(), now)`` next. Every
call first runs whatever timers are due at ``now``, so a late tick is harmless. All randomness comes from the
seeded ``random.Random`` passed in, so a run is a pure function of (config, seed, inputs, times).

What it does (memberlist's design, timers turned into deadlines):

* Probing, one member a probe interval: every ``RING_EVERY``-th probe goes to our successor on a ring of the
  table ordered by a hash of the peer id (:func:`ring_key`, the same ring in every member's table; the first
  ALIVE member after us), the others round-robin over a shuffled member list (reshuffled after each pass, new
  members inserted at a random position, the first pass started at a random point of it). Round-robin alone
  lets the probes of one member by all the others arrive like a Poisson stream: a crash waits an exponential
  time for its first probe, so the slowest of 40 crashes among 100 members waited 4-6 s (p99 full detection
  1.2-1.6x memberlist's formula; issue 33). With the ring every member is probed by its predecessor every
  ``RING_EVERY`` intervals (the round-robin has the other probes), so the wait is at most that. A member that
  hears another suspect one of its ``suspicion_confirmations(n) + 2`` next live ring successors probes it next:
  the independent confirmations that shorten the suspicion (below) come at once, not from the round-robin's
  slower share. A member that places itself on the ring before another (a ground key) only takes the ring's
  probes of that one away; the round-robin still probes it.
* A probe sends a ping; after ``probe_timeout`` without an ack it asks ``indirect_checks``
  random alive members to ping the target (ping-req); at the end of the probe interval without any ack the
  target is suspected.
* Lifeguard: probe interval and timeout are scaled by local health (:mod:`.awareness`); intermediaries send a
  nack when their relay ping times out, and missing nacks count against OUR health, not the target's;
  suspicion timeouts start long and shrink with independent confirmations (:mod:`.suspicion`).
* Incarnations and refutation: a suspect/dead/left claim about us at our incarnation or newer makes us bump
  the incarnation and gossip ALIVE, and send it straight back to the member that told us. A member we hold
  dead or left that talks to us (it restarted, or resumed after a pause) is told so, at most once a probe
  interval, so it refutes at once.
* First contact: a member that joined our table (or came back from gone) within the last
  ``awareness_max_multiplier`` probe intervals and never answered one of our pings is probed with the largest
  Lifeguard stretch (``awareness_max_multiplier`` times the probe timeout; the next probe waits for that probe's
  end, and no longer once it is answered): our first ping to it sets up a connection and may need a handshake, and
  the member has often just started. Measured with five ``local`` daemons started together on two cores: first
  pings took 130-440 ms where later ones took 4-10 ms, and a healthy member was suspected at every start. The
  window matters: in a swarm of n members a member pings each other one only every n probe intervals, so "never
  answered" alone would stretch nearly every probe of a large swarm for minutes (issue 33: detection at 100 and
  1,000 members 3x slower, the probe rate 8x lower).
* Gossip: every update we accept is queued (:mod:`.broadcast`) and piggybacked on pings/acks/ping-reqs and
  sent to ``gossip_nodes`` random members every ``gossip_interval``, each at most
  ``retransmit_mult*ceil(log10(n+1))`` times.
* Push/pull: every ``push_pull_interval`` (scaled up above 32 members) a full-state exchange with one random
  member; a DEAD in a remote state is only taken as SUSPECT (memberlist's rule).
* Dead and left members stay as tombstones for ``tombstone_ttl`` (see the state table in :mod:`.state`).
* Leave: LEFT is sent at once to every live member; then the core is silent.
* Duplicate identity: an ALIVE for our peer id with another address or key is surfaced as
  :class:`~.events.DuplicateIdentity`, never merged.
* A full-state sync carries gone members (dead or left) as a DEAD claim by the sender: LEFT is only ever made
  by its subject, and a restarted member must hear that it is held gone, so that it refutes at once instead of
  waiting for the tombstone to expire (a stopped-and-started daemon is then back as fast as a crashed one).

Peers are strangers (see :mod:`.guard` for the rules): every update from the network passes
:func:`~.guard.check_update` (who may claim what, incarnation range and window) and drops are counted in
:attr:`Membership.dropped`. A member new to us joins the table only when its first message reaches us directly
(its push/pull, ping, ack or gossip: the driver authenticated the sender); one we only heard of from someone
else waits as *pending*, is pinged, and joins when it answers. Pending members are bounded per source
(``max_pending_per_source``) and in total (``max_pending``); the table is bounded in total (``max_members``,
evicting only tombstones, never a live member) and per address host (``max_members_per_host``). So a stranger
that sends thousands of self-signed ALIVEs costs a bounded table of pings and displaces nobody.

Error handling: events are trusted to be authenticated by the driver (ALIVE and LEFT signed by their subject,
``sender`` the key that sealed the message). Unknown event types raise ``TypeError`` (a driver bug).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from arceusd.membership.awareness import Awareness
from arceusd.membership.broadcast import BroadcastQueue
from arceusd.membership.config import MembershipConfig
from arceusd.membership.events import (
    PACKET_OVERHEAD,
    AckReceived,
    Action,
    Address,
    DuplicateIdentity,
    Event,
    Gossip,
    GossipReceived,
    Join,
    Leave,
    MemberChanged,
    MemberState,
    NackReceived,
    PeerId,
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
    UpdateKind,
    update_size,
)
from arceusd.membership.guard import Drop, check_update, host_of, refuted_incarnation
from arceusd.membership.state import Decision, Member, decide, target_state
from arceusd.membership.suspicion import Suspicion

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)
_GONE = (MemberState.DEAD, MemberState.LEFT)
_KIND_OF = {
    MemberState.ALIVE: UpdateKind.ALIVE,
    MemberState.SUSPECT: UpdateKind.SUSPECT,
    MemberState.DEAD: UpdateKind.DEAD,
    MemberState.LEFT: UpdateKind.LEFT,
}


# A helper nacks an indirect probe after this fraction of the probe timeout. The requester asks for help a probe
# timeout into its probe and gives up one probe interval (two timeouts) in: a nack sent a full timeout after the
# request arrives lands just after the requester's deadline, counts as missing, and raised the requester's
# awareness after every failed probe of a dead member (a third of a churning 100-member swarm then probed 2-3x
# slower; issue 33). 80 % leaves the nack a fifth of a timeout to travel. The helper still forwards the target's
# ack for the whole timeout: a nack says "nothing yet", and closing the relay early lost late acks on busy
# machines (false suspicions in five local daemons).
NACK_FRACTION = 0.8

# Every RING_EVERY-th probe goes to our ring successor (see the module docstring), the others round-robin.
RING_EVERY = 2


def ring_key(peer: PeerId) -> bytes:
    """A member's place on the probe ring: a hash of its peer id, the same in every member's table."""
    return hashlib.blake2b(peer.encode(), digest_size=8).digest()


@dataclass(slots=True)
class _Probe:
    target: PeerId
    incarnation: int
    seq: int
    direct_deadline: float
    deadline: float
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0
    # When the next probe is due if this one is answered (a first contact's probe may hold it back until then).
    answered_next: float = 0.0


@dataclass(slots=True)
class _Pending:
    """A member we heard of from ``source`` and pinged; it joins the table when it answers by itself."""

    update: Update
    source: PeerId
    deadline: float
    pings_left: int
    next_ping: float


@dataclass(slots=True)
class _Relay:
    requester: PeerId
    reply_to: Address
    requester_seq: int
    deadline: float  # when we stop forwarding the target's ack (a probe timeout after the request)
    nack_at: float  # when we tell the requester we have heard nothing yet (NACK_FRACTION of that)
    nacked: bool = False


class Membership:
    """One member's view of the cluster. See the module docstring for the driver contract."""

    def __init__(
        self,
        config: MembershipConfig,
        self_id: PeerId,
        address: Address,
        public_key: bytes,
        rng: random.Random,
        now: float,
        incarnation: int = 1,
    ) -> None:
        if not self_id:
            raise ValueError("self_id must be a non-empty peer id")
        if incarnation < 1:
            raise ValueError("incarnation starts at 1")
        self.config = config
        self.self_id = self_id
        self.address = address
        self.public_key = public_key
        self._rng = rng
        self._members: dict[PeerId, Member] = {
            self_id: Member(self_id, MemberState.ALIVE, incarnation, address, public_key, now)
        }
        self._order: list[PeerId] = []
        self._index = 0
        self._phased = False  # whether our first pass started at a random point of the order (see below)
        self._ring_self = (ring_key(self_id), self_id)
        self._ring: list[tuple[bytes, PeerId]] = [self._ring_self]  # every member in the table, by ring key
        self._probes = 0  # probes started from our own schedule (ring or round-robin)
        self._confirm_next: PeerId | None = None  # a ring successor just suspected by another: probe it next
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._suspicions: dict[PeerId, Suspicion] = {}
        self._tombstones: list[tuple[float, PeerId, float]] = []
        self._seq = 0
        self._queue = BroadcastQueue()
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._left = False
        self._seen_duplicates: set[tuple[Address, bytes, int]] = set()
        self._pending: dict[PeerId, _Pending] = {}
        self._told: dict[PeerId, float] = {}  # when we last told a gone member it is held gone
        self._answered: set[PeerId] = set()  # members that acked one of our pings (no longer a first contact)
        self._met: dict[PeerId, float] = {}  # when a member joined our table or came back from gone
        self.dropped: Counter[str] = Counter()
        # Stagger the periodic work so members started together do not probe in lockstep.
        self._next_probe = now + rng.random() * config.probe_interval
        self._next_gossip = now + rng.random() * config.gossip_interval
        self._next_push_pull = now + (0.5 + rng.random() * 0.5) * config.push_pull_interval
        self._queue.push(self._self_alive())

    # ------------------------------------------------------------------------------------------- queries
    @property
    def incarnation(self) -> int:
        return self._members[self.self_id].incarnation

    @property
    def health_score(self) -> int:
        return self._awareness.score

    @property
    def has_left(self) -> bool:
        return self._left

    @property
    def members(self) -> Mapping[PeerId, Member]:
        """Read-only view of the member table, tombstones included (do not mutate the records)."""
        return MappingProxyType(self._members)

    def state_of(self, peer: PeerId) -> MemberState | None:
        member = self._members.get(peer)
        return None if member is None else member.state

    def live_peers(self) -> frozenset[PeerId]:
        """Members we consider alive or suspect (suspects may just be slow), ourselves included."""
        return frozenset(p for p, m in self._members.items() if m.state in _LIVE)

    def next_deadline(self) -> float:
        """The time at which :meth:`handle` should next be called with :class:`Tick` (``inf`` once left)."""
        if self._left:
            return math.inf
        deadline = min(self._next_probe, self._next_gossip, self._next_push_pull)
        if self._probe is not None:
            probe = self._probe
            deadline = min(deadline, probe.deadline if probe.indirect_sent else probe.direct_deadline)
        for relay in self._relays.values():
            deadline = min(deadline, relay.deadline if relay.nacked else relay.nack_at)
        for suspicion in self._suspicions.values():
            deadline = min(deadline, suspicion.deadline)
        if self._tombstones:
            deadline = min(deadline, self._tombstones[0][0])
        for pending in self._pending.values():
            deadline = min(deadline, pending.next_ping, pending.deadline)
        return deadline

    @property
    def pending(self) -> frozenset[PeerId]:
        """Members we heard of from others and wait to hear from directly (not in the table yet)."""
        return frozenset(self._pending)

    def bootstrap(self, known: Gossip, now: float) -> list[Action]:
        """Merge a trusted snapshot of ALIVE members (tests, benchmarks, a cached peer list) WITHOUT queueing
        them for re-gossip, so n members can start converged without n x n broadcasts.

        Returns the MemberChanged actions.
        """
        actions: list[Action] = []
        for update in known:
            if update.kind is not UpdateKind.ALIVE:
                raise ValueError(f"bootstrap takes ALIVE updates only, got {update.kind.value} for {update.peer}")
            self._apply(update, now, actions, rebroadcast=False)
        return actions

    # ------------------------------------------------------------------------------------------- handling
    def handle(self, event: Event, now: float) -> list[Action]:
        """Run timers due at ``now``, then ``event``; return the actions to carry out, in order."""
        actions: list[Action] = []
        if self._left:
            return actions
        self._advance(now, actions)
        sender = getattr(event, "sender", None)
        if sender is not None and sender in self._pending:
            self._verified(sender, now, actions)
        elif sender is not None:
            self._tell_if_gone(sender, now, actions)
        if isinstance(event, Tick):
            pass
        elif isinstance(event, PingReceived):
            self._merge(event.sender, event.gossip, now, actions)
            if event.target in ("", self.self_id):
                actions.append(SendAck(event.sender, event.reply_to, event.seq, self._piggyback()))
        elif isinstance(event, AckReceived):
            if event.sender in self._members:
                self._answered.add(event.sender)
            self._merge(event.sender, event.gossip, now, actions)
            self._on_ack(event.seq, actions)
        elif isinstance(event, NackReceived):
            if self._probe is not None and self._probe.seq == event.seq:
                self._probe.nacks += 1
        elif isinstance(event, PingReqReceived):
            self._merge(event.sender, event.gossip, now, actions)
            seq = self._next_seq()
            self._relays[seq] = _Relay(
                event.sender,
                event.reply_to,
                event.seq,
                now + self.config.probe_timeout,
                now + NACK_FRACTION * self.config.probe_timeout,
            )
            actions.append(SendPing(event.target, event.target_address, seq, self._piggyback()))
        elif isinstance(event, GossipReceived):
            self._merge(event.sender, event.gossip, now, actions)
        elif isinstance(event, PushPullReceived):
            self._merge_remote_state(event.sender, event.states, now, actions)
            if not event.is_reply:
                actions.append(SendPushPull(event.sender, event.reply_to, self._full_state(), True))
        elif isinstance(event, Join):
            actions.append(SendPushPull("", event.address, self._full_state(), False))
        elif isinstance(event, Leave):
            self._leave(now, actions)
        else:
            raise TypeError(f"Membership.handle got {type(event).__name__}, which is not a membership event")
        return actions

    # ------------------------------------------------------------------------------------------- timers
    def _advance(self, now: float, actions: list[Action]) -> None:
        probe = self._probe
        if probe is not None and not probe.indirect_sent and now >= probe.direct_deadline:
            self._send_indirect(probe, actions)
        if probe is not None and now >= probe.deadline:
            self._probe_failed(probe, now, actions)
        if now >= self._next_probe:
            self._start_probe(now, actions)
        for relay in self._relays.values():
            if not relay.nacked and now >= relay.nack_at:
                relay.nacked = True
                actions.append(SendNack(relay.requester, relay.reply_to, relay.requester_seq))
        for seq in [s for s, r in self._relays.items() if now >= r.deadline]:
            del self._relays[seq]  # an ack after this is too late for the requester's probe
        for peer in [p for p, s in self._suspicions.items() if now >= s.deadline]:
            suspicion = self._suspicions.pop(peer)
            dead = Update(UpdateKind.DEAD, peer, suspicion.incarnation, self.self_id)
            self._apply(dead, now, actions)
        if now >= self._next_gossip:
            self._next_gossip = now + self.config.gossip_interval
            self._gossip(now, actions)
        if now >= self._next_push_pull:
            self._next_push_pull = now + self.config.push_pull_interval_for(len(self._members))
            for partner in self._random_members(1, lambda m: m.state is MemberState.ALIVE):
                actions.append(SendPushPull(partner.peer, partner.address, self._full_state(), False))
        self._advance_pending(now, actions)
        while self._tombstones and now >= self._tombstones[0][0]:
            _, gone, changed_at = heapq.heappop(self._tombstones)
            member = self._members.get(gone)
            if member is not None and member.state in _GONE and member.state_change == changed_at:
                del self._members[gone]
                self._ring_remove(gone)
                self._told.pop(gone, None)
                self._answered.discard(gone)
                self._met.pop(gone, None)
                actions.append(
                    MemberChanged(gone, member.state, None, member.incarnation, member.address, member.public_key)
                )

    def _start_probe(self, now: float, actions: list[Action]) -> None:
        self._next_probe = now + self._awareness.scale(self.config.probe_interval)
        self._probes += 1
        target = self._ring_successor() if self._probes % RING_EVERY == 0 else None
        if target is None and self._confirm_next is not None:  # a confirmation takes a round-robin turn
            target = self._members.get(self._confirm_next)
            self._confirm_next = None
            if target is not None and target.state is not MemberState.SUSPECT:
                target = None
        target = target or self._next_probe_target()
        if target is None:
            return
        seq = self._next_seq()
        timeout = self._awareness.scale(self.config.probe_timeout)
        answered_next = self._next_probe
        if self._first_contact(target.peer, now):  # see the module docstring
            stretch = self.config.awareness_max_multiplier
            timeout = max(timeout, stretch * self.config.probe_timeout)
            self._next_probe = max(self._next_probe, now + stretch * self.config.probe_interval)
        self._probe = _Probe(
            target.peer,
            target.incarnation,
            seq,
            direct_deadline=now + timeout,
            deadline=self._next_probe,
            answered_next=answered_next,
        )
        gossip = self._piggyback()
        if target.state is MemberState.SUSPECT:  # tell it, so it can refute at once
            gossip = (Update(UpdateKind.SUSPECT, target.peer, target.incarnation, self.self_id), *gossip)
        actions.append(SendPing(target.peer, target.address, seq, gossip))

    def _first_contact(self, peer: PeerId, now: float) -> bool:
        """Whether ``peer`` is new to us (met within the stretch window) and never answered our pings."""
        if peer in self._answered:
            return False
        window = self.config.awareness_max_multiplier * self.config.probe_interval
        return now - self._met.get(peer, -math.inf) < window

    def _send_indirect(self, probe: _Probe, actions: list[Action]) -> None:
        probe.indirect_sent = True
        target = self._members.get(probe.target)
        if target is None:
            return
        helpers = self._random_members(
            self.config.indirect_checks,
            lambda m: m.state is MemberState.ALIVE and m.peer != probe.target,
        )
        probe.expected_nacks = len(helpers)
        for helper in helpers:
            actions.append(
                SendPingReq(helper.peer, helper.address, probe.seq, target.peer, target.address, self._piggyback())
            )

    def _probe_failed(self, probe: _Probe, now: float, actions: list[Action]) -> None:
        self._probe = None
        if probe.expected_nacks > 0:
            self._awareness.apply_delta(probe.expected_nacks - min(probe.nacks, probe.expected_nacks))
        else:
            self._awareness.apply_delta(1)
        member = self._members.get(probe.target)
        if member is None or member.state not in _LIVE:
            return
        self._apply(Update(UpdateKind.SUSPECT, probe.target, probe.incarnation, self.self_id), now, actions)

    def _on_ack(self, seq: int, actions: list[Action]) -> None:
        if self._probe is not None and self._probe.seq == seq:
            self._next_probe = min(self._next_probe, self._probe.answered_next)
            self._probe = None
            self._awareness.apply_delta(-1)
            return
        relay = self._relays.pop(seq, None)
        if relay is not None:
            actions.append(SendAck(relay.requester, relay.reply_to, relay.requester_seq, self._piggyback()))

    def _gossip(self, now: float, actions: list[Action]) -> None:
        if not len(self._queue):
            return
        # gossip_nodes live members, and one member gone for less than gossip_to_the_dead_time gets a copy of the
        # first message (so a member wrongly held dead hears it and refutes). memberlist draws its gossip_nodes
        # from both, so recently dead members take transmissions from the living: with many failures in a row
        # (40 of 100 members crashed two seconds apart in bench/membership_sim.py) a DEAD update used up its
        # retransmissions on the dead, some living member never heard it and waited for its own suspicion
        # timer (full detection p99 26 s against memberlist's 9.6 s; issue 33).
        targets = self._random_members(self.config.gossip_nodes, lambda m: m.state in _LIVE)
        dead_window = self.config.gossip_to_the_dead_time
        gone = self._random_members(1, lambda m: m.state in _GONE and now - m.state_change < dead_window)
        first: Gossip = ()
        for member in targets:
            gossip = self._piggyback()
            if not gossip:
                break
            first = first or gossip
            actions.append(SendGossip(member.peer, member.address, gossip))
        if first and gone:
            actions.append(SendGossip(gone[0].peer, gone[0].address, first))

    # ------------------------------------------------------------------------------------------- merging
    def _merge(self, sender: PeerId, gossip: Gossip, now: float, actions: list[Action]) -> None:
        for update in gossip:
            self._receive(sender, update, now, actions)

    def _merge_remote_state(self, sender: PeerId, states: Gossip, now: float, actions: list[Action]) -> None:
        # ALIVEs first: the sender's own ALIVE makes it a member before its claims about others are judged.
        for update in sorted(states, key=lambda u: u.kind is not UpdateKind.ALIVE):
            if update.kind in (UpdateKind.DEAD, UpdateKind.SUSPECT) and update.peer != self.self_id:
                update = Update(UpdateKind.SUSPECT, update.peer, update.incarnation, sender or update.origin)
            self._receive(sender, update, now, actions)

    def _receive(self, sender: PeerId, update: Update, now: float, actions: list[Action]) -> None:
        """An update from the network: check it (:mod:`.guard`), hold new members pending, then apply."""
        member = self._members.get(update.peer)
        origin = self._members.get(update.origin)
        origin_is_member = update.origin == self.self_id or origin is not None
        drop = check_update(update, None if member is None else member.incarnation, origin_is_member)
        if drop is None and member is None and update.kind is UpdateKind.ALIVE:
            if sender != update.peer:
                self._hold_pending(sender, update, now, actions)
                return
            self._pending.pop(update.peer, None)
            drop = self._admit(update, now, actions)
        if drop is not None:
            self.dropped[drop.value] += 1
            return
        before = self.incarnation
        self._apply(update, now, actions)
        if self.incarnation != before:
            self._announce_refutation(sender, update.kind, actions)
        elif update.peer == self.self_id and update.kind is UpdateKind.DEAD:
            # held dead at an incarnation we already refuted: the teller missed our ALIVE, so give it to it
            told_by = self._members.get(sender)
            if told_by is not None and sender != self.self_id:
                actions.append(SendGossip(sender, told_by.address, (self._self_alive(),)))

    def _announce_refutation(self, sender: PeerId, kind: UpdateKind, actions: list[Action]) -> None:
        """We just refuted a claim ``sender`` passed us. A suspicion: answer the sender at once (gossip spreads
        it further). Held dead or left (we restarted, or resumed after a pause): every member may hold us gone,
        and gossip to the gone stops after a few transmissions, so tell each member we know directly, once,
        as a leaving member does."""
        alive = (self._self_alive(),)
        if kind is UpdateKind.SUSPECT:
            told_by = self._members.get(sender)
            if told_by is not None and sender != self.self_id:
                actions.append(SendGossip(sender, told_by.address, alive))
            return
        for member in self._members.values():
            if member.peer != self.self_id and member.state is not MemberState.LEFT:
                actions.append(SendGossip(member.peer, member.address, alive))
        for peer, pending in self._pending.items():
            actions.append(SendGossip(peer, pending.update.address, alive))

    def _tell_if_gone(self, sender: PeerId, now: float, actions: list[Action]) -> None:
        """A member we hold dead or left is talking to us: it runs (restarted, or resumed after a pause) at an
        incarnation we hold gone. Tell it, so it refutes now instead of at its next push/pull (at most once a
        probe interval per member)."""
        member = self._members.get(sender)
        if member is None or member.state not in _GONE:
            return
        if now - self._told.get(sender, -math.inf) < self.config.probe_interval:
            return
        self._told[sender] = now
        claim = Update(UpdateKind.DEAD, sender, member.incarnation, self.self_id)
        actions.append(SendGossip(sender, member.address, (claim,)))

    # ------------------------------------------------------------------------------------------- admission
    def _hold_pending(self, source: PeerId, update: Update, now: float, actions: list[Action]) -> None:
        pending = self._pending.get(update.peer)
        if pending is not None:
            if update.incarnation > pending.update.incarnation:
                pending.update = update
            return
        if len(self._pending) >= self.config.max_pending:
            self.dropped[Drop.PENDING_TOTAL.value] += 1
            return
        if sum(1 for p in self._pending.values() if p.source == source) >= self.config.max_pending_per_source:
            self.dropped[Drop.PENDING_PER_SOURCE.value] += 1
            return
        interval = self.config.probe_interval
        self._pending[update.peer] = _Pending(update, source, now + 4 * interval, 3, now)
        self._advance_pending(now, actions)

    def _advance_pending(self, now: float, actions: list[Action]) -> None:
        for peer in [p for p, pending in self._pending.items() if now >= pending.deadline]:
            del self._pending[peer]
        for pending in self._pending.values():
            if now >= pending.next_ping and pending.pings_left > 0:
                pending.pings_left -= 1
                pending.next_ping = now + self.config.probe_interval if pending.pings_left else math.inf
                # the ping introduces us (our own ALIVE, from us: it may not know us either) without spending
                # the broadcast queue's transmissions on a burst of verification pings
                u = pending.update
                actions.append(SendPing(u.peer, u.address, self._next_seq(), (self._self_alive(),)))

    def _verified(self, peer: PeerId, now: float, actions: list[Action]) -> None:
        """``peer`` (pending) reached us directly: it holds its key and answers at an address."""
        update = self._pending.pop(peer).update
        drop = self._admit(update, now, actions)
        if drop is not None:
            self.dropped[drop.value] += 1
            return
        self._apply(update, now, actions)

    def _admit(self, update: Update, now: float, actions: list[Action]) -> Drop | None:
        """Room in the table for a new member: per host, then in total (evicting the oldest tombstone)."""
        host = host_of(update.address)
        same_host = sum(1 for m in self._members.values() if m.state in _LIVE and host_of(m.address) == host)
        if same_host >= self.config.max_members_per_host:
            return Drop.PER_HOST
        if len(self._members) < self.config.max_members:
            return None
        gone = [m for m in self._members.values() if m.state in _GONE]
        if not gone:
            return Drop.TABLE_FULL
        oldest = min(gone, key=lambda m: m.state_change)
        del self._members[oldest.peer]
        self._ring_remove(oldest.peer)
        self._told.pop(oldest.peer, None)
        self._answered.discard(oldest.peer)
        self._met.pop(oldest.peer, None)
        actions.append(
            MemberChanged(oldest.peer, oldest.state, None, oldest.incarnation, oldest.address, oldest.public_key)
        )
        return None

    def _apply(self, update: Update, now: float, actions: list[Action], rebroadcast: bool = True) -> None:
        if update.peer == self.self_id:
            self._about_self(update, actions)
            return
        member = self._members.get(update.peer)
        decision = decide(
            None if member is None else member.state,
            0 if member is None else member.incarnation,
            update.kind,
            update.incarnation,
        )
        if decision is Decision.IGNORE:
            return
        if decision is Decision.CONFIRM:
            suspicion = self._suspicions.get(update.peer)
            if suspicion is not None and suspicion.confirm(update.origin):
                self._queue.push(update)
            return
        new_state = target_state(update.kind)
        if member is None:
            member = Member(update.peer, new_state, update.incarnation, update.address, update.public_key, now)
            self._members[update.peer] = member
            self._insert_in_order(update.peer)
            bisect.insort(self._ring, (ring_key(update.peer), update.peer))
            self._met[update.peer] = now
            previous: MemberState | None = None
            changed = True
        else:
            previous = member.state
            changed = previous is not new_state
            if update.kind is UpdateKind.ALIVE and (
                member.address != update.address or member.public_key != update.public_key
            ):
                member.address, member.public_key = update.address, update.public_key
                changed = True
            member.state, member.incarnation = new_state, update.incarnation
            if previous is not new_state:
                member.state_change = now
            if previous in _GONE and new_state in _LIVE:
                self._met[update.peer] = now  # back from gone: a first contact again
        if rebroadcast:
            self._queue.push(update)
        self._suspicions.pop(update.peer, None)
        if new_state is MemberState.SUSPECT:
            n = len(self._members)
            # one of the few members just before it on the ring: confirm (or clear) it with our next probe
            if (
                previous is MemberState.ALIVE
                and update.origin != self.self_id
                and update.peer in self._ring_successors(self.config.suspicion_confirmations(n) + 2, _LIVE)
            ):
                self._confirm_next = update.peer
            self._suspicions[update.peer] = Suspicion(
                update.origin,
                update.incarnation,
                self.config.suspicion_confirmations(n),
                self.config.suspicion_min_timeout(n),
                self.config.suspicion_max_timeout(n),
                now,
            )
        elif new_state in _GONE:
            self._answered.discard(update.peer)
            heapq.heappush(self._tombstones, (now + self.config.tombstone_ttl, update.peer, member.state_change))
        if changed:
            actions.append(
                MemberChanged(update.peer, previous, new_state, member.incarnation, member.address, member.public_key)
            )

    def _about_self(self, update: Update, actions: list[Action]) -> None:
        me = self._members[self.self_id]
        if update.kind is UpdateKind.ALIVE:
            if update.address != self.address or update.public_key != self.public_key:
                key = (update.address, update.public_key, update.incarnation)
                if key not in self._seen_duplicates:
                    self._seen_duplicates.add(key)
                    actions.append(
                        DuplicateIdentity(
                            self.self_id,
                            update.incarnation,
                            self.address,
                            self.public_key,
                            update.address,
                            update.public_key,
                        )
                    )
                if update.incarnation >= me.incarnation:
                    self._refute(update.incarnation)
            elif update.incarnation > me.incarnation:
                self._refute(update.incarnation)  # an ALIVE from a previous life of ours
            return
        if update.incarnation >= me.incarnation:
            self._refute(update.incarnation)

    def _refute(self, incarnation: int) -> None:
        me = self._members[self.self_id]
        me.incarnation = refuted_incarnation(me.incarnation, incarnation)
        self._awareness.apply_delta(1)
        self._queue.push(self._self_alive())

    def _leave(self, now: float, actions: list[Action]) -> None:
        me = self._members[self.self_id]
        me.state, me.state_change = MemberState.LEFT, now
        left = (Update(UpdateKind.LEFT, self.self_id, me.incarnation, self.self_id),)
        for member in self._members.values():
            if member.peer != self.self_id and member.state in _LIVE:
                actions.append(SendGossip(member.peer, member.address, left))
        self._left = True
        self._probe = None
        self._relays.clear()

    # ------------------------------------------------------------------------------------------- helpers
    def _self_alive(self) -> Update:
        me = self._members[self.self_id]
        return Update(UpdateKind.ALIVE, self.self_id, me.incarnation, self.self_id, self.address, self.public_key)

    def _full_state(self) -> Gossip:
        out = []
        for m in self._members.values():
            if m.state is MemberState.ALIVE or m.peer == self.self_id:
                out.append(Update(_KIND_OF[m.state], m.peer, m.incarnation, m.peer, m.address, m.public_key))
            else:  # gone members travel as our DEAD claim (see the module docstring)
                kind = UpdateKind.SUSPECT if m.state is MemberState.SUSPECT else UpdateKind.DEAD
                out.append(Update(kind, m.peer, m.incarnation, self.self_id))
        return tuple(out)

    def _piggyback(self) -> Gossip:
        limit = self.config.retransmit_limit(len(self._members))
        return self._queue.take(self.config.packet_budget - PACKET_OVERHEAD, limit, update_size)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _insert_in_order(self, peer: PeerId) -> None:
        self._order.append(peer)
        offset = self._rng.randrange(len(self._order))
        self._order[offset], self._order[-1] = self._order[-1], self._order[offset]

    def _ring_remove(self, peer: PeerId) -> None:
        at = bisect.bisect_left(self._ring, (ring_key(peer), peer))
        if at < len(self._ring) and self._ring[at][1] == peer:
            del self._ring[at]

    def _ring_successor(self) -> Member | None:
        """The first ALIVE member after us on the ring. Suspects are passed over: a suspect ahead of us may have
        crashed too, and the member after it would wait for its death to be probed by us."""
        successors = self._ring_successors(1, (MemberState.ALIVE,))
        return self._members[successors[0]] if successors else None

    def _ring_successors(self, k: int, states: tuple[MemberState, ...]) -> list[PeerId]:
        """The first ``k`` members after us on the ring whose state is in ``states``."""
        ring = self._ring
        at = bisect.bisect_left(ring, self._ring_self)
        out: list[PeerId] = []
        for step in range(1, len(ring)):
            peer = ring[(at + step) % len(ring)][1]
            member = self._members.get(peer)
            if member is not None and member.state in states:
                out.append(peer)
                if len(out) >= k:
                    break
        return out

    def _next_probe_target(self) -> Member | None:
        if not self._phased and len(self._order) > 1:
            # Our first pass over a table of others starts at a random point of the order (those before it wait
            # for the next pass). Members that learned the same table at the same moment (started together from
            # one snapshot, or joined through one seed) would otherwise walk passes of the same length in
            # lockstep: near the end of a pass nearly every member has already probed a given member and probes
            # it again only in its next pass, so a crash there went unprobed for up to a pass (issue 33: first
            # detection 11.5 s of a crash 81 s into the passes of 100 members, p99 full detection 2.06x
            # memberlist). A random phase keeps each member's passes whole after the first and spreads the
            # pass boundaries over the pass.
            self._phased = True
            self._index = self._rng.randrange(len(self._order))
        for _ in range(2 * len(self._members) + 2):
            if self._index >= len(self._order):
                self._order = [p for p in self._members if p != self.self_id]
                self._rng.shuffle(self._order)
                self._index = 0
                if not self._order:
                    return None
            peer = self._order[self._index]
            self._index += 1
            member = self._members.get(peer)
            if member is not None and member.state in _LIVE:
                return member
        return None

    def _random_members(self, k: int, accept: Callable[[Member], bool]) -> list[Member]:
        chosen: list[Member] = []
        order = self._order
        if not order:
            return chosen
        seen: set[PeerId] = set()
        for _ in range(3 * len(order)):
            if len(chosen) >= k:
                break
            peer = order[self._rng.randrange(len(order))]
            if peer in seen or peer == self.self_id:
                continue
            seen.add(peer)
            member = self._members.get(peer)
            if member is not None and accept(member):
                chosen.append(member)
        return chosen
