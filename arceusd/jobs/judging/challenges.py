"""Leader-timed speed challenges: what a member's offered speed is worth, measured on the leader's own clock
(issue #19: a member's claims are measured, not believed).

Where the devices a member works with see it (its pipeline neighbours, its tensor-parallel partners), the leader
judges it on their waits (:mod:`arceusd.jobs.judging.claims`). That view is only as good as the viewers: where one other
device alone sees a member (an end of the pipeline next to a member that does not lead, a group of two), a rank
that lies about its waits, or two colluding neighbours, it is word against word. A challenge needs nobody's word:

1. the leader asks a member to get ready for ``rounds`` products of two ``size`` x ``size`` float32 matrices, whose
   entries are a hash of (seed, round, row, column) (:func:`challenge_size`: about :data:`TARGET_S` seconds of
   work at the speed the member offered); the member loads a child process (its daemon never runs torch,
   :mod:`arceusd.worker.speed_challenge`) and says when it is ready;
2. the leader sends a fresh random seed and starts its clock; the member computes every product and a digest of
   each of its rows (the sum of a nonlinear function of the row's values: it takes the whole row, and is one
   float to hash), and answers the Merkle root over blocks of :data:`BLOCK_ROWS` rows' digests
   (:func:`merkle_root`); the clock stops at the answer. Its speed is the work over that time, on the leader's
   clock;
3. the leader then names :data:`OPENED` blocks at random (:func:`blocks_to_open`); the member sends their
   digests and Merkle proofs; the leader checks the proofs against the root (:func:`verify_proof`) and
   recomputes those rows in a child process of its own, within :data:`TOLERANCE` (different hardware rounds
   differently).

A member that skipped a fraction of the blocks is caught with probability 1 - (1 - fraction) ** OPENED: to pass
half the time it must compute 92 % of them, so the time it answered in is close to what the work takes it. It
cannot answer faster than its hardware, only slower, which only lowers the speed it is planned at.

The leader challenges itself the same way (its own child, timed alike), so how much slower than their offers
every device ran while training beside the challenge is known, and a member is judged against the others
(:func:`challenge_factor`), as the job's step times are (:func:`arceusd.jobs.judging.claims.overclaim`).

Pure functions: hashing, sizes, the judgement. The trio parts: the leader's :mod:`arceusd.jobs.leader.speed_checks`,
the member's :mod:`arceusd.jobs.member.speed_answers`, their child :mod:`arceusd.jobs.procs.challenge_child`.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arceusd.jobs.judging.claims import MAX_DISCOUNT, RELATIVE_SLOW

TARGET_S = 0.15
"""Seconds a challenge's work takes at the speed the member offered (small beside a step, large beside a round
trip on a LAN)."""
SIZES = (256, 512, 1024, 2048, 4096)
"""Matrix sizes a challenge may use (the largest whose product is at most half the work)."""
BLOCK_ROWS = 16
"""Rows per Merkle leaf: a leaf is the digests of one block of rows of one round's product (``BLOCK_ROWS``
float32)."""
MAX_ROUNDS = 1024
"""The most products one challenge asks for (a member refuses more)."""
OPENED = 8
"""Blocks the leader opens and recomputes per challenge."""
TOLERANCE = 1e-2
"""Largest relative error (norm of the difference over the norm of the leader's rows) an opened block may have."""
MIN_WAIT_S = 10.0
"""The leader waits at least this long for a member's answer..."""
WAIT_FACTOR = 40.0
"""...and up to this many times what the work takes at the offered speed..."""
MAX_WAIT_S = 60.0
"""...but never longer than this; a member that has not answered by then ran at most its work over this time."""
READY_S = 30.0
"""How long a member may take to load its child (torch) before it is ready, and the leader waits for it."""
REPLY_S = 10.0
"""How long the leader waits for a member's ready and blocks answers (beyond the ready time); a member ends a challenge
whose seed has not come within ``READY_S + REPLY_S`` of its request."""
ROUND_EXCESS_S = 0.25
"""A challenge counts against a member only when it took at least this long over its offer's time (a few
milliseconds of round trip and pipes do not make a liar)."""
CHALLENGE_ID_LEN = 32
"""A challenge's id: hex characters the leader draws (``protocol.job_wire.CHALLENGE_ID``)."""
_HEX = frozenset("0123456789abcdef")
CONFIRM_BELOW = 2.0
"""A first challenge that says a member ran fewer than this many times :data:`claims.RELATIVE_SLOW` slower is
asked again (one hiccup is not a lie); the member keeps the faster of the two."""


def challenge_size(offered_flops: float) -> tuple[int, int]:
    """(size, rounds) of a challenge for a device offering ``offered_flops`` FLOP/s: about :data:`TARGET_S`
    seconds of matrix products at that speed, each product at most half of it."""
    work = max(1.0, offered_flops) * TARGET_S
    size = SIZES[0]
    for s in SIZES:
        if 2.0 * s**3 * 2 <= work:
            size = s
    rounds = max(1, min(MAX_ROUNDS, math.ceil(work / (2.0 * size**3))))
    return size, rounds


def challenge_flops(size: int, rounds: int) -> float:
    """The floating-point operations a challenge of ``rounds`` products of ``size`` x ``size`` matrices takes."""
    return 2.0 * float(size) ** 3 * rounds


def check_size(size: int, rounds: int) -> str | None:
    """Why a challenge of this shape is refused (a member's check of the leader's request), or None."""
    if size not in SIZES:
        return f"challenge size {size} is not one of {SIZES}"
    if not 1 <= rounds <= MAX_ROUNDS:
        return f"challenge rounds {rounds} is outside 1..{MAX_ROUNDS}"
    return None


def check_request(challenge: str, size: int, rounds: int, deadline_s: float) -> str | None:
    """Why a member refuses a leader's challenge request (its shape, id or wait out of bounds), or None."""
    why = check_size(size, rounds)
    if why:
        return why
    if len(challenge) != CHALLENGE_ID_LEN or not set(challenge) <= _HEX:
        return f"the challenge id is not {CHALLENGE_ID_LEN} hex characters"
    if not (math.isfinite(deadline_s) and 0 < deadline_s <= MAX_WAIT_S):
        return f"the challenge's wait {deadline_s!r} s is outside (0, {MAX_WAIT_S:g}]"
    return None


def check_seed(seed: str) -> str | None:
    """Why a challenge's seed is refused (not 64 lowercase hex characters), or None."""
    return None if len(seed) == 64 and set(seed) <= _HEX else "the seed is not 64 hex characters"


def leaf_count(size: int, rounds: int) -> int:
    return rounds * (size // BLOCK_ROWS)


def leaf_position(index: int, size: int) -> tuple[int, int]:
    """(round, first row) of leaf ``index``."""
    per_round = size // BLOCK_ROWS
    return index // per_round, (index % per_round) * BLOCK_ROWS


def new_seed() -> str:
    return secrets.token_hex(32)


def seed_value(seed: str) -> int:
    """The 62-bit integer the matrices are generated from (a seed is 64 hex characters)."""
    return int(seed[:16], 16) & ((1 << 62) - 1)


def blocks_to_open(size: int, rounds: int, count: int = OPENED) -> tuple[int, ...]:
    """``count`` distinct leaves at random (fewer when there are fewer), chosen after the member's root."""
    total = leaf_count(size, rounds)
    chosen: set[int] = set()
    while len(chosen) < min(count, total):
        chosen.add(secrets.randbelow(total))
    return tuple(sorted(chosen))


# -- Merkle tree over the blocks ----------------------------------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _parents(level: Sequence[bytes]) -> list[bytes]:
    """The next level up: pairs hashed, an odd last node carried up as it is."""
    up = [_node(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
    if len(level) % 2:
        up.append(level[-1])
    return up


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The root over leaf hashes (:func:`leaf_hash`); at least one leaf."""
    if not leaves:
        raise ValueError("a Merkle tree needs at least one leaf")
    level = list(leaves)
    while len(level) > 1:
        level = _parents(level)
    return level[0]


def merkle_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """The sibling hashes from leaf ``index`` up to the root (a level where it has no sibling adds none)."""
    proof: list[bytes] = []
    level = list(leaves)
    while len(level) > 1:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(level[sibling])
        level = _parents(level)
        index //= 2
    return proof


def verify_proof(leaf: bytes, index: int, count: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether ``leaf`` is leaf ``index`` of a tree of ``count`` leaves whose root is ``root``."""
    if not 0 <= index < count:
        return False
    node, width, used = leaf, count, 0
    while width > 1:
        sibling = index ^ 1
        if sibling < width:
            if used >= len(proof):
                return False
            other = proof[used]
            used += 1
            node = _node(node, other) if index % 2 == 0 else _node(other, node)
        index //= 2
        width = (width + 1) // 2
    return used == len(proof) and node == root


# -- the judgement ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    """One device's challenge: the speed it offered, the work asked, and the seconds the leader's clock took (for
    a member that did not answer in time: what the leader waited, so the speed is an upper bound). ``why``: the
    challenge failed (wrong blocks, refused): its time says nothing."""

    offered_flops: float
    flops: float
    seconds: float
    why: str = ""

    @property
    def measured_flops(self) -> float:
        """The speed the challenge showed (0 for a failed one)."""
        return 0.0 if self.why or self.seconds <= 0 else self.flops / self.seconds

    @property
    def slowdown(self) -> float:
        """How many times slower than its offer it ran (a failed challenge: :data:`claims.MAX_DISCOUNT`)."""
        if self.why:
            return MAX_DISCOUNT
        return min(MAX_DISCOUNT, max(1.0, self.seconds / (self.flops / self.offered_flops)))

    @property
    def excess_s(self) -> float:
        """Seconds over what the work takes at the offered speed (a failed challenge: infinite)."""
        return math.inf if self.why else self.seconds - self.flops / self.offered_flops

    def summary(self) -> dict[str, float | str]:
        """What ``arceusd status JOB`` shows under ``speed_checks``."""
        return {
            "offered_gflops": round(self.offered_flops / 1e9, 3),
            "measured_gflops": round(self.measured_flops / 1e9, 3),
            "seconds": round(self.seconds, 3),
            "slowdown": round(self.slowdown, 2),
            "failed": self.why,
        }


def challenge_factor(timed: Mapping[str, Timed], peer: str) -> float | None:
    """How many times slower than its offer ``peer`` ran its challenge, relative to how the other devices
    challenged ran against theirs (the mean of their slowdowns, at least 1: all of them share the machine
    with the job), when that is more than :data:`claims.RELATIVE_SLOW` and it took :data:`ROUND_EXCESS_S`
    longer than its offer says; None otherwise and while no other device was timed. A failed challenge
    (wrong blocks, refused) counts as :data:`claims.MAX_DISCOUNT` times slower."""
    got = timed.get(peer)
    others = [t.slowdown for p, t in timed.items() if p != peer and not t.why]
    if got is None or not others or got.excess_s < ROUND_EXCESS_S:
        return None
    if got.why:
        return MAX_DISCOUNT
    factor = got.slowdown / max(1.0, sum(others) / len(others))
    return factor if factor > RELATIVE_SLOW else None


def worth_confirming(factor: float) -> bool:
    """Whether a first failed challenge is asked again before it counts (:data:`CONFIRM_BELOW`)."""
    return factor < CONFIRM_BELOW * RELATIVE_SLOW


def wait_for(offered_flops: float, size: int, rounds: int) -> float:
    """Seconds the leader waits for a member's root (:data:`MIN_WAIT_S`..:data:`MAX_WAIT_S`)."""
    at_offer = challenge_flops(size, rounds) / max(1.0, offered_flops)
    return min(MAX_WAIT_S, max(MIN_WAIT_S, WAIT_FACTOR * at_offer))


__all__ = [
    "BLOCK_ROWS",
    "CHALLENGE_ID_LEN",
    "CONFIRM_BELOW",
    "MAX_ROUNDS",
    "MAX_WAIT_S",
    "MIN_WAIT_S",
    "OPENED",
    "READY_S",
    "ROUND_EXCESS_S",
    "SIZES",
    "TARGET_S",
    "TOLERANCE",
    "WAIT_FACTOR",
    "Timed",
    "blocks_to_open",
    "challenge_factor",
    "challenge_flops",
    "challenge_size",
    "check_request",
    "check_seed",
    "check_size",
    "leaf_count",
    "leaf_hash",
    "leaf_position",
    "merkle_proof",
    "merkle_root",
    "new_seed",
    "seed_value",
    "verify_proof",
    "wait_for",
    "worth_confirming",
]
