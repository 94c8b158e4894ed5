"""A deterministic discrete-event network simulator driving membership + election cores in one process.

Owns :class:`Cluster` (used by tests/unit/test_cluster_sim.py and bench/membership_sim.py). It plays the role
the trio driver will play for real: it maps ``Send*`` actions to ``*Received`` events at the addressed core
after a random delay, drops messages by loss probability, partitions and crashes, calls ``handle(Tick())`` at
each core's
``next_deadline()``, feeds the membership view to the election, and carries out ``PersistTerm``. Everything
is a function of the seed: no clock, no threads.

Life cycle of a simulated daemon: :meth:`Cluster.stop` (graceful leave, like ``arceusd stop``),
:meth:`Cluster.crash` (SIGKILL), :meth:`Cluster.restart` (a new process, same identity: also the start of a
stopped member), :meth:`Cluster.pause` / :meth:`Cluster.resume` (SIGSTOP / SIGCONT: messages to it are lost, its
timers fire late on resume), and :meth:`Cluster.rejoin_isolated` (the daemon's seed loop: a member that knows
nobody alive contacts a running one again).

Records what the invariants and figures need: first time each observer marked a peer suspect/dead/left, every
``BecameLeader`` per (job, term), every peer's persisted terms (in order), message and byte counts (size model
from :mod:`.events`).
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from arceusd.elections import core as el
from arceusd.membership import events as ev
from arceusd.membership.config import MembershipConfig
from arceusd.membership.swim import Membership


@dataclass(frozen=True, slots=True)
class NetworkModel:
    delay_min: float = 0.0005
    delay_max: float = 0.002
    loss: float = 0.0


@dataclass(slots=True)
class SimNode:
    peer: ev.PeerId
    address: ev.Address
    membership: Membership
    election: el.Election | None
    up: bool = True
    wake_at: float = float("inf")
    last_join: float = float("-inf")
    persisted: tuple[int, ev.PeerId | None] = (0, None)


@dataclass(slots=True)
class Stats:
    messages: int = 0
    bytes: int = 0
    dropped: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def peer_name(i: int) -> ev.PeerId:
    return f"p{i:04d}"


class Cluster:
    """``n`` simulated peers ``p0000..``; the first ``job_size`` are members of job ``"job"``."""

    JOB = "job"

    def __init__(
        self,
        n: int,
        config: MembershipConfig,
        seed: int,
        net: NetworkModel | None = None,
        job_size: int = 0,
        election_config: el.ElectionConfig | None = None,
        start_converged: bool = True,
    ) -> None:
        self.config = config
        self.net = net or NetworkModel()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.election_config = election_config or el.election_local()
        self.job_members = frozenset(peer_name(i) for i in range(job_size))
        self._heap: list[tuple[float, int, str, ev.Address, int, object]] = []
        self._counter = 0
        self.nodes: dict[ev.Address, SimNode] = {}
        self.address_of: dict[ev.PeerId, ev.Address] = {}
        self.group: dict[ev.Address, int] = {}
        self.stats = Stats()
        self.marks: dict[tuple[ev.PeerId, ev.MemberState], dict[ev.PeerId, float]] = defaultdict(dict)
        self.leaders: dict[tuple[str, int], set[ev.PeerId]] = defaultdict(set)
        self.persist_log: dict[ev.PeerId, list[tuple[int, ev.PeerId | None]]] = defaultdict(list)
        self.duplicates: list[tuple[ev.PeerId, ev.DuplicateIdentity]] = []
        for i in range(n):
            self.add_node(peer_name(i))
        if start_converged:
            snapshot = tuple(self.alive_update(node) for node in self.nodes.values())
            for node in self.nodes.values():
                self._after_membership(node, node.membership.bootstrap(snapshot, self.now))
        else:
            first = next(iter(self.nodes.values()))
            for node in self.nodes.values():
                if node is not first:
                    self.inject(node, ev.Join(first.address))
        for node in self.nodes.values():
            self._reschedule(node)

    # ------------------------------------------------------------------------------------------ setup
    def add_node(self, peer: ev.PeerId, address: ev.Address | None = None) -> SimNode:
        address = address or f"addr-{peer}"
        membership = Membership(
            self.config, peer, address, peer.encode(), random.Random(self.rng.getrandbits(64)), self.now
        )
        node = SimNode(peer, address, membership, None)
        if peer in self.job_members:
            term, voted = self.persisted_of(peer)
            node.election = el.Election(
                self.JOB,
                peer,
                self.job_members,
                self.election_config,
                random.Random(self.rng.getrandbits(64)),
                self.now,
                term,
                voted,
            )
        self.nodes[address] = node
        self.address_of.setdefault(peer, address)
        self.group.setdefault(address, 0)
        self._feed_view(node)
        return node

    def persisted_of(self, peer: ev.PeerId) -> tuple[int, ev.PeerId | None]:
        log = self.persist_log.get(peer)
        return log[-1] if log else (0, None)

    def alive_update(self, node: SimNode) -> ev.Update:
        m = node.membership
        return ev.Update(ev.UpdateKind.ALIVE, node.peer, m.incarnation, node.peer, node.address, m.public_key)

    # ------------------------------------------------------------------------------------------ control
    def crash(self, peer: ev.PeerId) -> None:
        self.nodes[self.address_of[peer]].up = False

    def stop(self, peer: ev.PeerId) -> None:
        """Graceful stop: LEFT goes out to every live member, then the process is gone."""
        node = self.nodes[self.address_of[peer]]
        self.inject(node, ev.Leave())
        node.up = False

    def pause(self, peer: ev.PeerId) -> None:
        """SIGSTOP: the process neither handles messages (they are lost) nor runs timers until resumed."""
        self.nodes[self.address_of[peer]].up = False

    def resume(self, peer: ev.PeerId) -> None:
        """SIGCONT: timers that fell due meanwhile run at once."""
        node = self.nodes[self.address_of[peer]]
        node.up = True
        node.wake_at = float("inf")
        self._reschedule(node)

    def rejoin_isolated(self, retry_after: float = 0.2) -> None:
        """The daemon's seed loop: a running member that holds nobody else live contacts a running one."""
        running = [n for n in self.nodes.values() if n.up]
        for node in running:
            if len(node.membership.live_peers()) > 1 or self.now - node.last_join < retry_after:
                continue
            seeds = [n.address for n in running if n is not node]
            if seeds:
                node.last_join = self.now
                self.inject(node, ev.Join(self.rng.choice(seeds)))

    def restart(self, peer: ev.PeerId) -> SimNode:
        """A fresh process with the same identity and persisted election state; joins via a random up peer.
        A peer never seen before starts here for the first time."""
        address = self.address_of.get(peer, f"addr-{peer}")
        self.nodes.pop(address, None)
        node = self.add_node(peer, address)
        seeds = [n.address for n in self.nodes.values() if n.up and n is not node]
        if seeds:
            node.last_join = self.now
            self.inject(node, ev.Join(self.rng.choice(seeds)))
        self._reschedule(node)
        return node

    def partition(self, groups: Iterable[Iterable[ev.PeerId]]) -> None:
        """Peers in different groups cannot talk; peers not named form group 0."""
        for address in self.group:
            self.group[address] = 0
        for index, members in enumerate(groups, start=1):
            for peer in members:
                self.group[self.address_of[peer]] = index

    def heal(self) -> None:
        self.partition(())

    def inject(self, node: SimNode, event: ev.Event) -> None:
        self._after_membership(node, node.membership.handle(event, self.now))
        self._reschedule(node)

    # ------------------------------------------------------------------------------------------ running
    def run_until(self, until: float, max_events: int = 50_000_000) -> None:
        for _ in range(max_events):
            if not self._heap or self._heap[0][0] > until:
                break
            time, _, kind, address, sender_group, payload = heapq.heappop(self._heap)
            self.now = max(self.now, time)
            node = self.nodes.get(address)
            if node is None or not node.up:
                continue
            if kind == "wake":
                if time != node.wake_at:
                    continue
                node.wake_at = float("inf")
                self._after_membership(node, node.membership.handle(ev.Tick(), self.now))
                if node.election is not None:
                    self._after_election(node, node.election.handle(el.ElectionTick(), self.now))
            elif self.group[address] != sender_group:
                self.stats.dropped += 1
                continue
            elif isinstance(payload, el.ElectionEvent):
                if node.election is not None:
                    self._after_election(node, node.election.handle(payload, self.now))
            elif isinstance(payload, ev.Event):
                self._after_membership(node, node.membership.handle(payload, self.now))
            self._reschedule(node)
        else:
            raise RuntimeError(f"simulation did not reach t={until} within {max_events} events")
        self.now = max(self.now, until)

    def _reschedule(self, node: SimNode) -> None:
        deadline = node.membership.next_deadline()
        if node.election is not None:
            deadline = min(deadline, node.election.next_deadline())
        deadline = max(deadline, self.now)
        if deadline < node.wake_at or node.wake_at == float("inf"):
            if deadline == float("inf"):
                return
            node.wake_at = deadline
            self._push(deadline, "wake", node.address, 0, None)

    def _push(self, time: float, kind: str, address: ev.Address, group: int, payload: object) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (time, self._counter, kind, address, group, payload))

    def _send(self, node: SimNode, address: ev.Address, kind: str, event: object, size: int, label: str) -> None:
        self.stats.messages += 1
        self.stats.bytes += size
        self.stats.by_kind[label] += 1
        if self.net.loss and self.rng.random() < self.net.loss:
            self.stats.dropped += 1
            return
        delay = self.rng.uniform(self.net.delay_min, self.net.delay_max)
        self._push(self.now + delay, kind, address, self.group[node.address], event)

    def _after_membership(self, node: SimNode, actions: list[ev.Action]) -> None:
        view_changed = False
        me, addr = node.peer, node.address
        for action in actions:
            if isinstance(action, ev.MemberChanged):
                view_changed = True
                if action.state is not None and action.state is not ev.MemberState.ALIVE:
                    self.marks[(action.peer, action.state)].setdefault(me, self.now)
                continue
            if isinstance(action, ev.DuplicateIdentity):
                self.duplicates.append((me, action))
                continue
            size = ev.estimated_size(action)
            label = type(action).__name__
            event: ev.Event
            if isinstance(action, ev.SendPing):
                event = ev.PingReceived(me, addr, action.seq, action.to, action.gossip)
            elif isinstance(action, ev.SendAck):
                event = ev.AckReceived(me, action.seq, action.gossip)
            elif isinstance(action, ev.SendNack):
                event = ev.NackReceived(me, action.seq)
            elif isinstance(action, ev.SendPingReq):
                event = ev.PingReqReceived(me, addr, action.seq, action.target, action.target_address, action.gossip)
            elif isinstance(action, ev.SendGossip):
                event = ev.GossipReceived(me, action.gossip)
            else:
                event = ev.PushPullReceived(me, addr, action.states, action.is_reply)
            self._send(node, action.address, "member", event, size, label)
        if view_changed:
            self._feed_view(node)

    def _feed_view(self, node: SimNode) -> None:
        if node.election is not None:
            view = el.ViewChanged(node.membership.live_peers())
            self._after_election(node, node.election.handle(view, self.now))

    def _after_election(self, node: SimNode, actions: list[el.ElectionAction]) -> None:
        me = node.peer
        for action in actions:
            if isinstance(action, el.PersistTerm):
                self.persist_log[me].append((action.term, action.voted_for))
            elif isinstance(action, el.BecameLeader):
                self.leaders[(action.job, action.term)].add(me)
            elif isinstance(action, el.StateChanged):
                continue
            else:
                event: el.ElectionEvent
                if isinstance(action, el.SendVoteRequest):
                    event = el.VoteRequested(me, action.job, action.term, action.pre_vote)
                elif isinstance(action, el.SendVoteReply):
                    event = el.VoteReplied(me, action.job, action.term, action.granted, action.pre_vote, action.leader)
                else:
                    event = el.LeaderAnnounced(me, action.job, action.term)
                self._send(node, self.address_of[action.to], "election", event, 64, type(action).__name__)

    # ------------------------------------------------------------------------------------------ queries
    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    def node(self, peer: ev.PeerId) -> SimNode:
        return self.nodes[self.address_of[peer]]
