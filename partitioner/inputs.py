"""Planner inputs: device profiles, the link matrix and training parameters, bundled as ``PlanInputs``.

``PlanInputs.canonical()`` sorts devices by peer id and links by (source, destination), so any permutation
of the same facts plans (and hashes) identically. Validation raises ``ValueError`` saying which field is
wrong."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from partitioner.blocks import BlockCost

DEVICE_KINDS = ("cpu", "cuda", "mps")
MAX_BLOCK_EFFICIENCY = 4.0
"""A block may beat the square-matmul benchmark (a better kernel at its shape), but not by much more."""


@dataclass(frozen=True)
class DeviceProfile:
    """One member as the planner sees it: measured FLOP/s and the memory it offers to the job, plus the
    calibration that turns the matmul benchmark into the time a stage worker really takes (all measured on
    the device by ``arceusd.device.profile``; the defaults mean "no calibration", what profiles older than these
    fields say):

    - ``block_efficiency``: the fraction of ``flops_per_s`` the model's own blocks reach (forward + backward
      of a block of the job's shape against the square-matmul benchmark; real blocks are smaller and
      odd-shaped and add layer norms, softmax, GELU);
    - ``dispatch_s``: fixed seconds per block per micro-batch, forward + backward (Python and autograd
      dispatch: what a block of negligible size costs);
    - ``optimizer_s_per_param``: seconds of the job's optimizer step per parameter this device holds.
    """

    peer_id: str
    flops_per_s: float
    memory_bytes: int
    kind: str = "cpu"
    block_efficiency: float = 1.0
    dispatch_s: float = 0.0
    optimizer_s_per_param: float = 0.0

    def __post_init__(self) -> None:
        if not self.peer_id:
            raise ValueError("device peer_id must be a non-empty string")
        if not (math.isfinite(self.flops_per_s) and self.flops_per_s > 0):
            raise ValueError(f"device {self.peer_id}: flops_per_s must be positive, got {self.flops_per_s}")
        if self.memory_bytes < 0:
            raise ValueError(f"device {self.peer_id}: memory_bytes must be >= 0, got {self.memory_bytes}")
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"device {self.peer_id}: kind must be one of {DEVICE_KINDS}, got {self.kind!r}")
        if not (math.isfinite(self.block_efficiency) and 0 < self.block_efficiency <= MAX_BLOCK_EFFICIENCY):
            raise ValueError(
                f"device {self.peer_id}: block_efficiency must be in (0, {MAX_BLOCK_EFFICIENCY}], got "
                f"{self.block_efficiency} (the model's FLOP/s over the matmul benchmark's; 1.0 = uncalibrated)"
            )
        for name in ("dispatch_s", "optimizer_s_per_param"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"device {self.peer_id}: {name} must be a finite number >= 0, got {value}")

    @property
    def effective_flops_per_s(self) -> float:
        """What the model's blocks reach on this device: the benchmark's FLOP/s x ``block_efficiency``."""
        return self.flops_per_s * self.block_efficiency


@dataclass(frozen=True)
class Link:
    """A measured one-way link: ``rtt_s`` round-trip time (seconds), ``bandwidth_bytes_per_s``, and
    ``message_s``, the fixed cost of one message over it beyond the echo's round trip (tensor framing,
    authentication, the worker's thread hops, decoding: measured by ``arceusd.device.profile.measure_link``;
    0.0 = uncalibrated, what links older than the field say)."""

    rtt_s: float
    bandwidth_bytes_per_s: float
    message_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise ValueError(f"link rtt_s must be a finite number >= 0, got {self.rtt_s}")
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise ValueError(f"link bandwidth must be positive and finite, got {self.bandwidth_bytes_per_s}")
        if not (math.isfinite(self.message_s) and self.message_s >= 0):
            raise ValueError(f"link message_s must be a finite number >= 0, got {self.message_s}")


@dataclass(frozen=True)
class LinkMatrix:
    """Links for ordered pairs of peer ids, kept sorted. A missing pair means the link is unusable."""

    links: tuple[tuple[str, str, Link], ...]

    def __post_init__(self) -> None:
        seen: set[tuple[str, str]] = set()
        for src, dst, _ in self.links:
            if src == dst:
                raise ValueError(f"link from {src} to itself is not allowed")
            if (src, dst) in seen:
                raise ValueError(f"duplicate link {src} -> {dst}")
            seen.add((src, dst))
        ordered = tuple(sorted(self.links, key=lambda t: (t[0], t[1])))
        object.__setattr__(self, "links", ordered)

    @classmethod
    def from_mapping(cls, mapping: Mapping[tuple[str, str], Link]) -> LinkMatrix:
        return cls(tuple((src, dst, link) for (src, dst), link in mapping.items()))

    @classmethod
    def symmetric(cls, pairs: Iterable[tuple[str, str, Link]]) -> LinkMatrix:
        """Both directions of each given pair with the same figures."""
        out: dict[tuple[str, str], Link] = {}
        for a, b, link in pairs:
            out[(a, b)] = link
            out[(b, a)] = link
        return cls.from_mapping(out)

    def as_dict(self) -> dict[tuple[str, str], Link]:
        return {(src, dst): link for src, dst, link in self.links}


@dataclass(frozen=True)
class TrainingParams:
    """What the job fixes: global batch (samples per optimizer step) and the micro-batch counts it allows.

    ``wire_bytes_per_element`` / ``compute_bytes_per_element`` scales
    ``BlockCost.activation_bytes_per_sample`` (given in the compute dtype)
    to the bytes that cross a stage boundary (e.g. 2/4 with fp16 on the wire).
    ``max_tensor_parallel`` caps the size of a tensor-parallel group (1 disables tensor parallelism).
    ``use_all_devices`` asks for a plan that gives every device work even when fewer would be faster (a job
    that wants every member to contribute, or to spread memory); honoured exactly up to ``EXACT_MAX_DEVICES``
    devices, ignored by the heuristic beyond.
    """

    global_batch_size: int
    micro_batch_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    wire_bytes_per_element: int = 4
    compute_bytes_per_element: int = 4
    max_tensor_parallel: int = 4
    use_all_devices: bool = False

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise ValueError(f"global_batch_size must be positive, got {self.global_batch_size}")
        counts = tuple(sorted(set(self.micro_batch_counts)))
        if not counts or any(c <= 0 for c in counts):
            raise ValueError(f"micro_batch_counts must be positive integers, got {self.micro_batch_counts}")
        object.__setattr__(self, "micro_batch_counts", counts)
        if self.wire_bytes_per_element <= 0 or self.compute_bytes_per_element <= 0:
            raise ValueError("wire_bytes_per_element and compute_bytes_per_element must be positive")
        if self.max_tensor_parallel < 1:
            raise ValueError(f"max_tensor_parallel must be >= 1, got {self.max_tensor_parallel}")

    def usable_micro_batch_counts(self) -> tuple[int, ...]:
        """The allowed counts that divide the global batch evenly (every micro-batch the same size)."""
        return tuple(m for m in self.micro_batch_counts if self.global_batch_size % m == 0)


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan depends on. Two members with equal canonical inputs compute byte-identical plans."""

    blocks: tuple[BlockCost, ...]
    devices: tuple[DeviceProfile, ...]
    links: LinkMatrix
    training: TrainingParams

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ValueError("the model has no blocks to place")
        ids = [d.peer_id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate device peer ids in {sorted(ids)}")
        names = [b.name for b in self.blocks]
        if len(set(names)) != len(names):
            raise ValueError("block names must be unique")

    def canonical(self) -> PlanInputs:
        """Devices sorted by peer id; links restricted to listed devices (already sorted by LinkMatrix)."""
        devices = tuple(sorted(self.devices, key=lambda d: d.peer_id))
        ids = {d.peer_id for d in devices}
        links = LinkMatrix(tuple(t for t in self.links.links if t[0] in ids and t[1] in ids))
        return PlanInputs(self.blocks, devices, links, self.training)
