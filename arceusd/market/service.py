"""The daemon's market service: the machine's latest probe reading, the ledger, and the market's part in jobs.

I/O only; every decision is a pure call into ``arceusd.market.needs`` / ``policy`` / ``pricing`` /
``receipts``. It:
- samples the probe (``arceusd.market.probes``) every :data:`SAMPLE_S` in a thread and reloads the policy from
  config.toml (``arceusd policy --set`` takes effect without a restart);
- answers ``market`` (announced jobs, this device's price, whether it qualifies and why not);
- gates automatic joins (``hooks.may_auto_join``) and, with ``auto_join``, offers this device again to the jobs
  it was kept from or left once the policy and the job's needs hold;
- when the owner comes back (a lending condition fails), leaves every job it works in as a member through the
  ``leave`` control method, so the leader repartitions at once;
- opens and verifies the ledger at start (a ledger that does not verify is reported in ``status`` and the log
  and receives nothing), issues receipts at the leader's committed checkpoints (``hooks.on_commit``), sends
  each to its device to countersign (:class:`~protocol.market_wire.ReceiptOffer`) and countersigns the ones
  it receives after checking them against its own worker's record;
- prices the leader's receipts at the speed it measured of each device (``arceusd.market.paid_speed``);
- as a member, watches that its checkpoints are paid: an owner that leaves more than
  ``policy.unpaid_checkpoints`` of them without a countersigned receipt above $0 is left, said in ``status``
  (``pay``, ``left_unpaid``), ``market`` and the dashboard, and not offered this device again
  (``arceusd.market.unpaid``);
- as a job's owner, once the job ended, asks the job's leaders and devices for the receipts they keep for it and
  keeps the ones its ledger lacks (``arceusd.market.collect``: after a standby took the job over, that leader
  signed them), so ``arceusd bill`` is complete; as a keeper, answers those requests from the job's owner only.
It reads the jobs through the job manager's plain attributes (``node.jobs.jobs``: a job's spec, owner,
leader, members, plan, shares, step, epoch) and its public ``offer()``; it changes jobs only through the
control methods ``join`` and ``leave``, and through the hooks' answers (``arceusd.market.hooks``): a leader's
join refused for the job's needs or budget (a waiting job's ``error`` then says why), and a job stopped at a
checkpoint once its budget is spent (``arceusd.market.admission``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import trio

from arceusd.base.control import RequestError
from arceusd.device.node import JobService, Node
from arceusd.jobs.procs.warm_starts import warm_starts
from arceusd.market.admission import Member, Spend, budget_stop, devices_for_memory, join_refusal, projected_usd
from arceusd.market.authority import AuthorityError, authorise, from_bytes
from arceusd.market.collect import MAX_PAGES_PER_PEER, MAX_PEERS, ROUNDS_S, accept, kept_for, new_ones, page
from arceusd.market.forecast import rest_usd
from arceusd.market.ledger import Ledger, LedgerError
from arceusd.market.needs import DeviceOffer, JobNeeds, demand_in_view, match, pay
from arceusd.market.paid_speed import paid_speeds
from arceusd.market.policy import Policy, PolicyError, owner_back
from arceusd.market.policy_file import load_policy
from arceusd.market.pricing import Demand
from arceusd.market.probes import Probe, Snapshot, probe_for
from arceusd.market.quote import quote, step_flops
from arceusd.market.receipts import (
    Commit,
    DeviceRecord,
    LeaderBook,
    ReceiptError,
    SignedReceipt,
    billed,
    countersign,
    decode,
    device_check,
    encode,
    most_per_step_usd,
    sign_leader,
)
from arceusd.market.timings import read_timings
from arceusd.market.unpaid import PayWatch, leave_reason, unpaid
from arceusd.models.costs import block_costs
from partitioner import PlanError
from protocol.market_wire import ReceiptBatch, ReceiptOffer, ReceiptReply, ReceiptsRequest

if TYPE_CHECKING:
    from arceusd.network.peers import PeerService

log = logging.getLogger(__name__)

SAMPLE_S = 0.5
"""How often the machine is read: the owner's return is noticed within this, and the leave follows at once."""
REOFFER_S = 5.0
"""The least time between two automatic offers of this device to one job."""
RECEIPT_TIMEOUT_S = 10.0
TERMINAL = frozenset({"done", "failed", "cancelled"})


def own_pids(node: Node) -> list[int]:
    """The daemon, its fork server and its stage workers (their CPU use is not the owner's). Called from the
    probe's thread: a worker's ``os_pid`` (a process that exited is simply not found by the probe), never trio's
    liveness check, which raised there once a worker had exited."""
    server = warm_starts().server_pid
    pids = [os.getpid()] if server is None else [os.getpid(), server]
    manager = node.jobs
    for job in getattr(manager, "jobs", {}).values():
        worker = getattr(job, "worker", None)
        pid = getattr(worker, "os_pid", None)
        if isinstance(pid, int):
            pids.append(pid)
    return pids


class Market:
    """What the market service holds: the policy file's path, the probe and its latest reading."""

    def _jobs(self) -> JobService:
        if self.node.jobs is None:
            raise RuntimeError("the market runs beside the job service, which has not started")
        return self.node.jobs

    def _peers(self) -> PeerService:
        if self.node.peers is None:
            raise RuntimeError("the market runs beside the peer network, which has not started")
        return self.node.peers

    def __init__(self, node: Node) -> None:
        self.node = node
        self.policy = self._load()
        self.probe: Probe = probe_for(self.policy.probe_root, own_pids=lambda: own_pids(node))
        self.snapshot: Snapshot = Snapshot(None, None, None, None, time.localtime().tm_hour)
        self.ledger = Ledger.open(node.paths.root, node.identity)
        if not self.ledger.verified.ok:
            log.error(
                "the ledger %s does not verify: %s; no receipt is added to it until it is looked at "
                "(arceusd verify-ledger %s)",
                self.ledger.path,
                self.ledger.verified.error,
                self.ledger.path,
            )
        self.books: dict[str, LeaderBook] = {}
        self.since: dict[str, float] = {}  # job -> when this device was first seen working in it (wall clock)
        self.running_since: dict[str, float] = {}  # job -> when it was first seen running (wall clock)
        self.deferred: dict[str, float] = {}  # jobs kept from or left by the market -> when last offered
        self.left_for_owner: list[dict[str, Any]] = []
        self.refused_joins: list[dict[str, Any]] = []  # the leader's latest refusals (needs, budget)
        self.reoffers: list[dict[str, Any]] = []
        self.nursery: trio.Nursery | None = None
        self.collecting: set[str] = set()  # owned jobs whose receipts are being (or were) collected
        self.collected: dict[str, dict[str, int]] = {}  # job -> {"kept": n, "refused": n}: for status
        self.paid: dict[str, dict[str, dict[str, float | str]]] = {}  # job -> device -> its paid speed (leader)
        self.watches: dict[str, PayWatch] = {}  # job -> the checkpoints this member's worker passed (unpaid)
        self.pay: dict[str, dict[str, Any]] = {}  # job -> what this member is paid up to, and what is unpaid
        self.left_unpaid: dict[str, dict[str, Any]] = {}  # job -> when and why this member left it unpaid

    def _load(self) -> Policy:
        try:
            return load_policy(self.node.paths.config)
        except PolicyError as exc:
            log.warning("%s; lending under the default policy until it is fixed", exc)
            return Policy()

    def reload(self) -> Policy:
        new = self._load()
        if new.probe_root != self.policy.probe_root:
            self.probe = probe_for(new.probe_root, own_pids=lambda: own_pids(self.node))
        self.policy = new
        return new

    async def sample(self) -> Snapshot:
        self.snapshot = await trio.to_thread.run_sync(self.probe.snapshot, time.time())
        return self.snapshot

    def job_needs(self) -> list[tuple[Any, JobNeeds]]:
        out = []
        for job in getattr(self.node.jobs, "jobs", {}).values():
            if job.state in TERMINAL:
                continue
            try:
                needs = JobNeeds.from_spec(job.job_id, job.owner, job.spec, len(job.member_ids()))
            except (AssertionError, ValueError, TypeError):
                continue
            out.append((job, needs))
        return out

    def demand(self, jobs: list[tuple[Any, JobNeeds]]) -> Demand:
        peers = self.node.peers
        alive = len(peers.alive_peers()) if peers is not None else 1
        busy = len({m for job, _ in jobs for m in job.member_ids()})
        return demand_in_view([n for _, n in jobs], alive, busy)

    async def offer(self) -> DeviceOffer:
        o = await self._jobs().offer()
        return DeviceOffer(
            self.node.identity.peer_id,
            o.kind,
            int(o.memory_bytes),
            float(o.flops_per_s),
            self.node.config.worker_threads,
        )

    async def listing(self) -> dict[str, Any]:
        policy = self.reload()
        offer = await self.offer()
        efficiency = float((await self._jobs().offer()).block_efficiency)
        jobs = self.job_needs()
        demand = self.demand(jobs)
        me = self.node.identity.peer_id
        rows = []
        for job, needs in jobs:
            if job.owner == me:
                continue
            member = me in job.member_ids()  # the leader's offers, or the ids a member was told
            m = match(offer, policy, self.snapshot, needs, demand, member=member)
            unpaid_left = self.left_unpaid.get(job.job_id)
            reasons = [str(r) for r in m.reasons] + ([f"left unpaid: {unpaid_left['reason']}"] if unpaid_left else [])
            rows.append(
                {
                    "job_id": job.job_id,
                    "name": job.spec.name,
                    "owner": job.owner,
                    "state": job.state,
                    "members": needs.members,
                    "max_members": needs.max_members,
                    "max_price_per_hour": needs.max_price_per_hour,
                    "price_per_hour": m.price_per_hour,
                    "qualifies": m.qualifies and not unpaid_left,
                    "reasons": reasons,
                    "warnings": self.outlook(job, offer, efficiency, demand, member),
                }
            )
        return {
            "device": asdict(offer),
            "machine": asdict(self.snapshot),
            "demand": asdict(demand),
            "jobs": rows,
            "left_unpaid": list(self.left_unpaid.values()),
        }

    @staticmethod
    def outlook(job: Any, offer: DeviceOffer, efficiency: float, demand: Demand, member: bool) -> list[str]:
        """What of the job's budget and deadline cannot be met: the rest of the job on its members and this
        device, each like this one (enough of them for ``memory_total_mib``), as ``submit --quote`` estimates."""
        n = job.spec.needs
        if not n.budget_usd and not n.deadline_hours:
            return []
        steps = max(0, int(job.total_steps) - int(job.step))
        # the owner's device is one of them, always (a device that only saw the announce knows no members): the
        # quote leaves that one unpaid
        count = max(
            len({*job.member_ids(), job.owner}) + (0 if member else 1),
            n.min_members,
            devices_for_memory(n.memory_total_mib, offer.memory_bytes >> 20),
        )
        q = quote(
            steps * step_flops(job.spec),
            count,
            offer.flops_per_s,
            efficiency,
            demand,
            n.budget_usd,
            0.0,
            n.max_price_per_hour,
        )
        out = (
            []
            if q.within_budget
            else [
                f"the budget cannot be met: about ${q.usd:.6f} for the remaining {steps} step(s) on {count} device(s) "
                f"like this one, over needs.budget_usd ${n.budget_usd:.6f}"
            ]
        )
        if n.deadline_hours:
            left = n.deadline_hours - max(0.0, time.time() - float(job.created)) / 3600.0
            if q.hours > left:
                out.append(
                    f"the deadline cannot be met: about {q.hours * 60:.1f} min for the remaining {steps} "
                    f"step(s), {max(left, 0.0) * 60:.1f} min left of needs.deadline_hours "
                    f"{n.deadline_hours:g}"
                )
        return out

    # --- joining and leaving -------------------------------------------------------------------------------
    async def admit(self, job: Any) -> bool:
        """Whether this device joins ``job`` automatically now; if not, it is offered again later."""
        policy = self.policy
        if job.job_id in self.left_unpaid:
            log.info("not joining job %s again: %s", job.job_id[:12], self.left_unpaid[job.job_id]["reason"])
            return False
        try:
            offer = await self.offer()  # measured once (the join measures it anyway), then cached
        except RequestError as exc:
            log.warning("not joining job %s: %s", job.job_id[:12], exc)
            self.deferred[job.job_id] = time.monotonic()
            return False
        try:
            needs = JobNeeds.from_spec(job.job_id, job.owner, job.spec, len(job.member_ids()))
        except (AssertionError, ValueError, TypeError):
            return True
        jobs = self.job_needs()
        m = match(offer, policy, self.snapshot, needs, self.demand(jobs))
        if not m.qualifies:
            self.deferred[job.job_id] = time.monotonic()
            log.info("not joining job %s: %s", job.job_id[:12], m.why_not())
        return m.qualifies

    async def reoffer(self) -> None:
        """With ``auto_join``: join the jobs this device was kept from or left, once they qualify."""
        if not self.node.config.auto_join or not self.deferred or "join" not in self.node.methods:
            return
        now = time.monotonic()
        for job, _needs in self.job_needs():
            last = self.deferred.get(job.job_id)
            if last is None or now - last < REOFFER_S or job.role != "seen" or job.state not in ("announced", "left"):
                continue
            if not await self.admit(job):
                continue
            self.deferred.pop(job.job_id, None)
            try:
                result = await self.node.methods["join"]({"job_id": job.job_id})
                log.info("offered this device again to job %s: %s", job.job_id[:12], result)
                self.reoffers.append(
                    {
                        "job_id": job.job_id,
                        "at": time.time(),
                        "accepted": bool(result["accepted"]),
                        "reason": str(result.get("reason", "")),
                    }
                )
            except RequestError as exc:
                self.deferred[job.job_id] = now
                log.warning("offering this device again to job %s failed: %s", job.job_id[:12], exc)

    async def owner_is_back(self) -> None:
        """Leave every job this device works in as a member (the leader repartitions at once)."""
        if "leave" not in self.node.methods:
            return
        for job in list(getattr(self.node.jobs, "jobs", {}).values()):
            if job.role != "member" or job.state in TERMINAL or job.leader == self.node.identity.peer_id:
                continue
            began = time.monotonic()
            try:
                await self.node.methods["leave"]({"job_id": job.job_id})
            except RequestError as exc:
                log.warning("the owner is back but leaving job %s failed: %s", job.job_id[:12], exc)
                continue
            self.deferred[job.job_id] = time.monotonic()
            self.left_for_owner.append(
                {"job_id": job.job_id, "at": time.time(), "seconds": round(time.monotonic() - began, 3)}
            )
            log.warning("the owner is back: left job %s in %.2f s", job.job_id[:12], time.monotonic() - began)

    async def tick(self) -> None:
        await self.sample()
        self.reload()
        for job in getattr(self.node.jobs, "jobs", {}).values():
            if job.role in ("member", "owner") and job.job_id not in self.since:
                self.since[job.job_id] = time.time()
            if job.state == "running" and job.job_id not in self.running_since:
                self.running_since[job.job_id] = time.time()
        self.collect_ended_jobs()
        await self.watch_pay()
        if owner_back(self.policy, self.snapshot):
            await self.owner_is_back()
        else:
            await self.reoffer()

    # --- nobody works unpaid without knowing (arceusd.market.unpaid) ------------------------------------------
    def paid_to(self, job_id: str) -> tuple[int, int, float]:
        """This device's receipts for the job: the highest step a countersigned one above $0 pays to, how many
        pay $0, and the dollars."""
        me = self.node.identity.peer_id
        top = zero = 0
        usd = 0.0
        for s in self.ledger.entries:
            r = s.receipt
            if r.job_id != job_id or r.device != me or not s.countersigned:
                continue
            if r.usd > 0:
                top, usd = max(top, r.step_to), usd + r.usd
            else:
                zero += 1
        return top, zero, usd

    async def watch_pay(self) -> None:
        """As a member: leave a running job whose owner left more than ``policy.unpaid_checkpoints`` of this
        device's checkpoints unpaid, and say why."""
        me, now = self.node.identity.peer_id, time.time()
        for job in list(getattr(self.node.jobs, "jobs", {}).values()):
            if job.job_id in self.left_unpaid or job.role != "member" or me in (job.leader, job.owner):
                continue
            if job.state != "running":
                continue
            step = int(job.step)
            w = self.watches.get(job.job_id)
            if w is None:
                if step <= 0:
                    continue
                w = self.watches[job.job_id] = PayWatch.start(int(job.spec.checkpoint.interval_steps), step)
            w.see(step, now)
            top, zero, usd = self.paid_to(job.job_id)
            steps = unpaid(w, top, now, self.policy.receipt_grace_s)
            limit = self.policy.unpaid_checkpoints
            self.pay[job.job_id] = {
                "paid_to_step": top,
                "paid_usd": usd,
                "zero_receipts": zero,
                "unpaid_checkpoints": steps[-8:],
                "limit": limit,
            }
            why = leave_reason(steps, limit, zero, str(job.owner))
            if why is not None and "leave" in self.node.methods:
                await self._leave_unpaid(job, why, steps, step)

    async def _leave_unpaid(self, job: Any, why: str, steps: list[int], step: int) -> None:
        self.left_unpaid[job.job_id] = {
            "job_id": job.job_id,
            "owner": job.owner,
            "at": time.time(),
            "reason": why,
            "unpaid_checkpoints": steps[-8:],
            "worker_step": step,
        }
        log.warning("job %s: %s", job.job_id[:12], why)
        try:
            await self.node.methods["leave"]({"job_id": job.job_id})
        except RequestError as exc:
            log.warning("job %s: leaving it unpaid failed: %s", job.job_id[:12], exc)

    # --- receipts --------------------------------------------------------------------------------------------
    def on_commit(self, job: Any, step: int, term: int, epoch: int) -> str | None:
        """The leader committed ``step``: issue its receipts now (from the job as it is), send them later; why the
        job stops at this checkpoint (its budget: ``admission.budget_stop``), or None."""
        me = self.node.identity.peer_id
        book = self.books.get(job.job_id)
        if book is None:
            book = self.books[job.job_id] = LeaderBook()
            book.start(int(job.committed_step), self.running_since.get(job.job_id, job.created))
        try:
            commit = self._commit(job, step, term, epoch)
        except (AttributeError, TypeError, ValueError) as exc:
            log.warning("job %s: no receipts for step %d: %s", job.job_id[:12], step, exc)
            return None
        receipts = book.issue(me, commit)
        if receipts and self.nursery is not None:
            addresses = {p: getattr(o, "address", "") for p, o in job.members.items()}
            self.nursery.start_soon(
                self._settle,
                job,
                [sign_leader(self.node.identity, r) for r in receipts],
                addresses,
                self._authority(job),
            )
        spend = replace(self.spend(job), most_per_step_usd=most_per_step_usd(commit))
        stop = budget_stop(
            float(job.spec.needs.budget_usd), spend, step, int(job.total_steps), int(job.spec.checkpoint.interval_steps)
        )
        if stop is not None:
            log.warning("job %s: %s", job.job_id[:12], stop)
        return stop

    def _authority(self, job: Any) -> bytes:
        """What this leader's receipt offers carry (``arceusd.market.authority``): as the job's owner, its signed
        word that the plan's standby may lead (signed once per standby, kept in its own ledger first); as another
        leader, the owner's word for itself (empty when this ledger holds none: its receipts are then refused)."""
        me, owner = self.node.identity.peer_id, str(job.owner)
        if me != owner:
            held = self.ledger.authority(job.job_id, owner, me)
            return b"" if held is None else held.to_bytes()
        standby = str(getattr(job, "standby", "") or "")
        if not standby or standby == me:
            return b""
        held = self.ledger.authority(job.job_id, me, standby)
        if held is None:
            held = authorise(self.node.identity, job.job_id, standby, time.time())
            try:
                self.ledger.authorise(held)
            except LedgerError as exc:
                log.error("job %s: the authorisation of standby %s not kept: %s", job.job_id[:12], standby[:12], exc)
        return held.to_bytes()

    def spend(self, job: Any) -> Spend:
        """What this leader counts the job has cost so far, and per step (``LeaderBook``)."""
        book = self.books.get(job.job_id)
        return Spend() if book is None else Spend(book.spent_estimate(), book.per_step_usd())

    def rest_usd(self, job: Any, offers: list[Any], demand: Demand, remaining: int) -> float:
        """What the rest of the job would cost on ``offers``, as the quote prices it
        (:func:`arceusd.market.forecast.rest_usd`: this leader's plan over them, its own measured step factor);
        when no plan fits them yet, the perfect pipeline's lower bound (:func:`admission.projected_usd`). Plans:
        call it in a thread."""
        try:
            return rest_usd(
                job.spec,
                offers,
                self.node.identity.peer_id,
                str(job.owner),
                remaining,
                demand,
                read_timings(self.node.paths.root),
            )
        except PlanError:
            cap = float(job.spec.needs.max_price_per_hour)
            members = [
                Member(
                    float(o.flops_per_s),
                    float(o.block_efficiency),  # the owner's own device: not paid
                    pay(float(o.flops_per_s), cap, demand) if billed(job.owner, o.peer_id) else 0.0,
                )
                for o in offers
            ]
            return projected_usd(remaining * step_flops(job.spec), members)[1]

    async def join_refusal(self, job: Any, offer: Any) -> str | None:
        """The leader: why it does not admit ``offer`` as a new member (``admission.join_refusal``); with a
        budget, the rest of the job priced as the quote prices it, with this device (:meth:`rest_usd`)."""
        if offer.peer_id in job.members:
            return None  # a member joining again (after a restart, or the owner back) keeps its place
        n = job.spec.needs
        remaining = max(0, int(job.total_steps) - int(job.committed_step))
        usd = 0.0
        if float(n.budget_usd) > 0:
            demand = self.demand(self.job_needs())
            offers = [*job.members.values(), offer]
            usd = await trio.to_thread.run_sync(self.rest_usd, job, offers, demand, remaining)
        why = join_refusal(
            members=len(job.members),
            max_members=int(n.max_members),
            kinds=tuple(n.device_kinds),
            kind=str(offer.kind),
            lends_mib=int(offer.memory_bytes) >> 20,
            per_device_mib=int(n.memory_per_device_mib),
            budget_usd=float(n.budget_usd),
            spend=self.spend(job),
            remaining_steps=remaining,
            remaining_usd=usd,
        )
        if why is not None:
            log.info("job %s: not admitting %s: %s", job.job_id[:12], offer.peer_id[:12], why)
            self.refused_joins.append(
                {"job_id": job.job_id, "peer_id": offer.peer_id, "at": time.time(), "reason": why}
            )
            del self.refused_joins[:-20]
            if job.state == "waiting":
                job.error = f"not admitting {offer.peer_id[:12]}: {why}"
        return why

    def _commit(self, job: Any, step: int, term: int, epoch: int) -> Commit:
        blocks = job.inputs.blocks
        per_sample = sum(b.forward_flops_per_sample + b.backward_flops_per_sample for b in blocks)
        cap = float(job.spec.needs.max_price_per_hour)
        demand = self.demand(self.job_needs())
        # priced at what the leader measured of each device, never more than its offer (arceusd.market.paid_speed)
        speeds = paid_speeds(job, self.node.identity.peer_id)
        self.paid[job.job_id] = {peer: p.summary() for peer, p in speeds.items()}
        prices = {peer: pay(p.flops, cap, demand) for peer, p in speeds.items()}
        # the shard writers, and the other replicas' devices whose witness matched theirs
        # (arceusd.jobs.leader.witnesses)
        book = job.leading.commits
        reported = frozenset(book.reports.get(step, {})) | book.complete.get(step, frozenset())
        predicted = (
            job.replica_plan.predicted_step_time_s if job.replica_plan is not None else job.plan.predicted_step_time_s
        )
        return Commit(
            job.job_id,
            job.owner,
            term,
            epoch,
            step,
            time.time(),
            reported,
            dict(job.shares),
            per_sample * job.spec.training.batch_size,
            float(predicted),
            prices,
        )

    async def _settle(
        self, job: Any, signed: list[SignedReceipt], addresses: dict[str, str], authority: bytes = b""
    ) -> None:
        me = self.node.identity.peer_id
        for s in signed:
            r = s.receipt
            final = s
            if r.device == me:
                why = self._check(s)
                if not why:
                    final = countersign(self.node.identity, s)
            else:
                offer = ReceiptOffer(decode_body(s), s.leader_key, s.leader_sig, authority)
                reply = await self._peers().request(
                    addresses.get(r.device, ""),
                    r.device,
                    offer,
                    RECEIPT_TIMEOUT_S,
                    job_id=r.job_id,
                    term=r.term,
                    epoch=r.epoch,
                )
                if isinstance(reply, ReceiptReply) and reply.device_sig:
                    candidate = SignedReceipt(r, s.leader_key, s.leader_sig, reply.device_key, reply.device_sig)
                    try:
                        candidate.verify()
                        final = candidate
                    except ReceiptError as exc:
                        log.warning("job %s: %s's countersignature is invalid: %s", r.job_id[:12], r.device[:12], exc)
                else:
                    refused = reply.reason if isinstance(reply, ReceiptReply) else "no answer"
                    log.warning(
                        "job %s: %s did not countersign steps %d..%d: %s",
                        r.job_id[:12],
                        r.device[:12],
                        r.step_from,
                        r.step_to,
                        refused,
                    )
            self._append(final)

    def _append(self, s: SignedReceipt) -> None:
        try:
            self.ledger.append(s)
        except LedgerError as exc:
            log.error("receipt for job %s not kept: %s", s.receipt.job_id[:12], exc)

    def _check(self, s: SignedReceipt) -> list[str]:
        """This device's own record of the job against the receipt (``receipts.device_check``)."""
        r = s.receipt
        try:
            s.verify(require_device=False)
        except ReceiptError as exc:
            return [str(exc)]
        job = getattr(self.node.jobs, "jobs", {}).get(r.job_id)
        if job is None:
            return ["this device knows no such job"]
        if r.leader != job.leader and r.leader not in job.leaders:
            return ["the receipt's leader does not lead this job"]
        if r.owner != job.owner:
            return ["the receipt names another owner"]
        if not self.ledger.authorised(r.job_id, r.owner, r.leader):
            return [f"the job's owner has not authorised {r.leader[:12]} to sign its receipts"]

        per_sample = sum(c.forward_flops_per_sample + c.backward_flops_per_sample for c in block_costs(job.spec.model))
        record = DeviceRecord(
            r.job_id,
            self.node.identity.peer_id,
            int(job.epoch),
            int(job.step),
            self.since.get(r.job_id, job.created),
            per_sample * job.spec.training.batch_size,
            self.policy.min_price_per_hour,
        )
        return device_check(r, record, time.time())

    async def on_receipt(self, header: Any, msg: ReceiptOffer) -> ReceiptReply:
        me = self.node.identity
        try:
            receipt = decode(msg.body)
        except ReceiptError as exc:
            return ReceiptReply(me.public_key_raw, b"", str(exc)[:300])
        if header.sender != receipt.leader:
            return ReceiptReply(me.public_key_raw, b"", "a receipt must come from its leader")
        signed = SignedReceipt(receipt, msg.leader_key, msg.leader_sig)
        self._keep_authority(receipt, msg.authority)
        why = self._check(signed)
        if why:
            log.warning(
                "job %s: not countersigning steps %d..%d: %s",
                receipt.job_id[:12],
                receipt.step_from,
                receipt.step_to,
                "; ".join(why),
            )
            return ReceiptReply(me.public_key_raw, b"", "; ".join(why)[:300])
        both = countersign(me, signed)
        self._append(both)
        return ReceiptReply(me.public_key_raw, both.device_sig)

    def _keep_authority(self, r: Any, raw: bytes) -> None:
        """Keep the job owner's authorisation of a leader that came with a receipt offer, when it is one (signed by
        the receipt's owner, for its job)."""
        if not raw:
            return
        try:
            a = from_bytes(raw)
            if (a.auth.job_id, a.auth.owner) != (r.job_id, r.owner):
                raise AuthorityError("an authorisation for another job or owner")
            self.ledger.authorise(a)
        except (AuthorityError, LedgerError) as exc:
            log.warning("job %s: not keeping a leader authorisation from %s: %s", r.job_id[:12], r.leader[:12], exc)

    # --- the owner's copy of its jobs' receipts ------------------------------------------------------------------
    def collect_ended_jobs(self) -> None:
        """Start collecting the receipts of every job this device owns that has ended (once per job)."""
        me = self.node.identity.peer_id
        for job in list(getattr(self.node.jobs, "jobs", {}).values()):
            if job.owner == me and job.state in TERMINAL and job.job_id not in self.collecting and self.nursery:
                self.collecting.add(job.job_id)
                self.nursery.start_soon(self.collect, job)

    async def collect(self, job: Any) -> None:
        """Rounds at :data:`collect.ROUNDS_S` after the end: ask the job's leaders, then its devices."""
        began = trio.current_time()
        for at in ROUNDS_S:
            await trio.sleep_until(began + at)
            try:
                await self._collect_round(job)
            except Exception:  # the market must never take the daemon down
                log.exception("job %s: collecting receipts failed", job.job_id[:12])

    async def _collect_round(self, job: Any) -> None:
        me = self.node.identity.peer_id
        leaders = set(job.leaders) | {job.owner}
        asked: set[str] = {me}
        for phase in ("leaders", "devices"):
            known = [s for s in self.ledger.entries if s.receipt.job_id == job.job_id]
            if phase == "leaders":
                peers = sorted(leaders - asked)
            else:
                peers = sorted(({s.receipt.device for s in known} | set(job.members)) - asked)
            for peer in peers[: max(0, MAX_PEERS - len(asked) + 1)]:
                asked.add(peer)
                got = await self._fetch_receipts(job, peer, leaders)
                have = [s for s in self.ledger.entries if s.receipt.job_id == job.job_id]
                for s in new_ones(have, got):
                    self._append(s)
                    self.collected.setdefault(job.job_id, {"kept": 0, "refused": 0})["kept"] += 1

    async def _fetch_receipts(self, job: Any, peer: str, leaders: set[str]) -> list[SignedReceipt]:
        """Every receipt ``peer`` keeps for the job (pages, bounded), each checked (``collect.accept``)."""
        member = self._peers().membership.members.get(peer)
        offer = job.members.get(peer)
        address = member.address if member is not None and member.address else getattr(offer, "address", "")
        if not address:
            return []
        out: list[SignedReceipt] = []
        start = 0
        for _ in range(MAX_PAGES_PER_PEER):
            reply = await self._peers().request(
                address, peer, ReceiptsRequest(job.job_id, start), RECEIPT_TIMEOUT_S, job_id=job.job_id
            )
            if not isinstance(reply, ReceiptBatch) or reply.job_id != job.job_id:
                break
            for entry in reply.entries:
                try:
                    out.append(accept(entry, job.job_id, self.node.identity.peer_id, leaders))
                except ReceiptError as exc:
                    self.collected.setdefault(job.job_id, {"kept": 0, "refused": 0})["refused"] += 1
                    log.warning("job %s: not keeping a receipt from %s: %s", job.job_id[:12], peer[:12], exc)
            if not reply.more or not reply.entries:
                break
            start += len(reply.entries)
        return out

    async def on_receipts_request(self, header: Any, msg: ReceiptsRequest) -> ReceiptBatch:
        """The receipts this device keeps for the job, for the job's owner only (the one whose receipts they are)."""
        return page(kept_for(self.ledger.entries, msg.job_id, header.sender), msg.job_id, msg.start)

    def status(self) -> dict[str, Any]:
        return {
            "ledger": {
                "path": str(self.ledger.path),
                "ok": self.ledger.verified.ok,
                "error": self.ledger.verified.error,
                "receipts": len(self.ledger.entries),
            },
            "machine": asdict(self.snapshot),
            "owner_back": owner_back(self.policy, self.snapshot),
            "left_for_owner": self.left_for_owner[-20:],
            "reoffers": self.reoffers[-20:],
            "deferred": sorted(self.deferred),
            "collected": self.collected,
            "paid_speed": self.paid,
            "pay": self.pay,
            "left_unpaid": list(self.left_unpaid.values()),
            "refused_joins": self.refused_joins,
        }


def decode_body(s: SignedReceipt) -> bytes:
    return encode(s.receipt)


async def serve_market(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Read the machine every :data:`SAMPLE_S`, act on the owner's return, answer ``market``, settle receipts."""
    market = Market(node)
    node.market = market

    async def m_market(_params: dict[str, Any]) -> dict[str, Any]:
        if node.jobs is None:
            raise RequestError("the job service is not running")
        return await market.listing()

    node.methods["market"] = m_market
    node.sections["market"] = market.status
    if node.peers is not None:
        node.peers.register(ReceiptOffer, market.on_receipt)
        node.peers.register(ReceiptsRequest, market.on_receipts_request)
    await market.sample()
    async with trio.open_nursery() as nursery:
        market.nursery = nursery
        task_status.started()
        while True:
            await trio.sleep(SAMPLE_S)
            try:
                await market.tick()
            except Exception:  # the market must never take the daemon down
                log.exception("market tick failed")
