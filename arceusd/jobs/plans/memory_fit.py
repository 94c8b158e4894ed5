"""A job's training-state memory, and whether the devices a daemon sees can hold it. Pure and torch-free.

Owns the number ``arceusd submit`` (and ``--quote``, ``arceus.quote``) compares with what devices lend, and the
words of the refusal. The number is the planner's own memory model (``partitioner.cost``: per block
``2 x param_bytes + optimizer_bytes`` for the weights, their gradients and the optimizer state, plus the stash
of what autograd keeps for backward) summed over the blocks of ``arceusd.models.costs.block_costs``, with one
micro-batch (``batch_size / micro_batches`` samples) in flight through every block: the least any plan holds, on
any number of devices (a stage keeps at least one micro-batch; tensor-parallel shares add up to the whole). So a
job whose training state is larger than what all the devices lend together cannot be planned on them, and
refusing it never refuses a job the planner could place. The converse does not hold: a job that fits in total
may still not be placeable (a block larger than any one device, or more micro-batches in flight), and then it
waits for members as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from arceusd.jobs.spec.parsed import JobSpec
from arceusd.models.costs import block_costs
from partitioner.blocks import BlockCost

MIB = 1 << 20


@dataclass(frozen=True)
class TrainingMemory:
    """What training a model holds, in bytes, as the planner counts it."""

    state_bytes: int
    """Weights, gradients and optimizer state: ``sum(2 x param_bytes + optimizer_bytes)`` over the blocks."""
    activation_bytes: int
    """One micro-batch's stash through every block (what backward needs of the forward)."""

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes

    @property
    def mib(self) -> int:
        """The total in MiB, rounded up."""
        return math.ceil(self.total_bytes / MIB)


def blocks_memory(blocks: Sequence[BlockCost], batch_size: int, micro_batches: int = 1) -> TrainingMemory:
    """The training memory of ``blocks`` for a global batch of ``batch_size`` samples in ``micro_batches``
    micro-batches (the planner's micro-batch is ``batch_size // micro_batches``). Raises ``ValueError`` on a batch
    or micro-batch count below 1."""
    if batch_size < 1 or micro_batches < 1:
        raise ValueError(f"batch_size and micro_batches must be >= 1, got {batch_size} and {micro_batches}")
    micro = max(1, batch_size // micro_batches)
    state = sum(2 * b.param_bytes + b.optimizer_bytes for b in blocks)
    stash = sum(b.stash_bytes_per_sample for b in blocks) * micro
    return TrainingMemory(state, stash)


def training_memory(spec: JobSpec) -> TrainingMemory:
    """The training memory of a parsed spec, from the same block costs the leader plans with
    (``arceusd.jobs.plans.planning.plan_inputs``)."""
    blocks = block_costs(spec.model, optimizer=spec.training.optimizer)
    return blocks_memory(blocks, spec.training.batch_size, spec.training.micro_batches)


@dataclass(frozen=True)
class Lent:
    """What the devices a daemon sees lend: its own offer and its alive peers' answers, in bytes."""

    own_bytes: int
    peer_bytes: tuple[int, ...] = ()
    unanswered: int = 0
    """Alive peers that did not say what they lend in time (not counted)."""

    @property
    def total_bytes(self) -> int:
        return max(self.own_bytes, 0) + sum(max(b, 0) for b in self.peer_bytes)


def summary(need: TrainingMemory, lent: Lent) -> str:
    """Needed against lent, one sentence: the numbers of the refusal and of the quote."""
    peers = sum(max(b, 0) for b in lent.peer_bytes) >> 20
    text = (
        f"the model's training state needs {need.mib} MiB (weights, gradients and optimizer state "
        f"{math.ceil(need.state_bytes / MIB)} MiB, activations {math.ceil(need.activation_bytes / MIB)} MiB); "
        f"this device lends {lent.own_bytes >> 20} MiB and the {len(lent.peer_bytes)} other device(s) it sees "
        f"lend {peers} MiB, {lent.total_bytes >> 20} MiB in all"
    )
    if lent.unanswered:
        text += f" ({lent.unanswered} more did not say what they lend and are not counted)"
    return text


def fits(need: TrainingMemory, lent: Lent) -> bool:
    """Whether the devices lend at least the training memory between them (peers that did not answer may lend
    enough, so with any of them the answer is yes)."""
    return lent.unanswered > 0 or need.total_bytes <= lent.total_bytes


def devices_needed(need: TrainingMemory, per_device_bytes: int) -> int:
    """The least number of devices lending ``per_device_bytes`` each that can hold ``need`` (0: they lend
    nothing)."""
    if per_device_bytes <= 0:
        return 0
    return max(1, math.ceil(need.total_bytes / per_device_bytes))


def what_to_do(need: TrainingMemory, lent: Lent) -> str:
    """What the submitter can do about a job that does not fit."""
    short = max(need.total_bytes - lent.total_bytes, 0)
    more = (
        f" (about {devices_needed(TrainingMemory(short, 0), lent.own_bytes)} more like this one)"
        if lent.own_bytes > 0
        else ""
    )
    return (
        f"add devices that lend {math.ceil(short / MIB)} MiB more{more}, train a smaller model or a smaller "
        f"batch (training.batch_size, more training.micro_batches), or lend more memory "
        f"(arceusd start --lend-memory-mib, lend_memory_mib in config.toml)"
    )


def refusal(need: TrainingMemory, lent: Lent) -> str | None:
    """Why a job cannot be trained on the devices a daemon sees (None: it may be). One line."""
    if fits(need, lent):
        return None
    what = what_to_do(need, lent)
    return f"{summary(need, lent)}: it cannot be trained on them. {what[:1].upper()}{what[1:]}"


__all__ = [
    "MIB",
    "Lent",
    "TrainingMemory",
    "blocks_memory",
    "devices_needed",
    "fits",
    "refusal",
    "summary",
    "training_memory",
    "what_to_do",
]
