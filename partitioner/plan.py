"""The planner's output (``Plan`` and its ``Stage``/``DeviceShare`` parts) and its two error types.

A plan is a frozen value: ordered stages, each a contiguous block range [start, end) on one device or on a
tensor-parallel group with an explicit per-block split of heads and MLP columns, plus the micro-batch count,
schedule, predicted figures and the hash of the inputs it was computed from.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b")
PLAN_FORMAT_VERSION = 1


class PlanError(Exception):
    """No plan satisfies the constraints (memory, links, batch size); the message says what is missing."""


class PlanMismatch(Exception):
    """A received plan differs from the one recomputed from the same inputs: refuse it."""


@dataclass(frozen=True)
class DeviceShare:
    """What one device of a stage holds: per block of the stage, its attention heads and MLP columns.

    For a single-device stage the counts are the whole block's. ``heads[i]`` / ``mlp_columns[i]`` refer to
    block ``stage.start + i``. A stage's shares sum exactly to each block's ``heads`` / ``mlp_columns``.
    """

    peer_id: str
    heads: tuple[int, ...]
    mlp_columns: tuple[int, ...]


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: blocks [start, end) on ``devices`` (the first one is the stage head, which sends
    and receives the boundary activations). Times are per micro-batch, forward + backward, in seconds, except
    ``optimizer_s``: the stage's optimizer step, once per training step."""

    index: int
    start: int
    end: int
    devices: tuple[str, ...]
    shares: tuple[DeviceShare, ...]
    compute_s: float
    allreduce_s: float
    transfer_s: float
    time_s: float
    stash_micro_batches: int
    optimizer_s: float = 0.0


@dataclass(frozen=True)
class Plan:
    """A complete training plan. ``memory_bytes`` is (peer id, predicted peak bytes), sorted by peer id."""

    stages: tuple[Stage, ...]
    micro_batches: int
    micro_batch_size: int
    schedule: str
    predicted_step_time_s: float
    bubble_fraction: float
    memory_bytes: tuple[tuple[str, int], ...]
    inputs_hash: str
    format_version: int = PLAN_FORMAT_VERSION
    sync_s: float = 0.0
    """Per step: the scalar exchange (gradient norm and loss) over the first stage's head."""
    in_flight_cap: int = 0
    """1F1B only: at most this many micro-batches in flight on any stage (its stash), fewer than the schedule's
    warm-up keeps, because the model fits the devices no other way (``cost.py``: slower, as a stage waits for a
    gradient before its next forward); 0: the schedule's own."""

    @property
    def peer_ids(self) -> tuple[str, ...]:
        """Every device the plan uses, in stage order."""
        return tuple(p for s in self.stages for p in s.devices)
