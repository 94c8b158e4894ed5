"""A weight the first and the last pipeline stage both hold (a stock LM's tied embedding and LM head): the
gradient sum that keeps the two copies one weight.

Owns: :class:`TiedEnd` (which parameter of a stage is its end of the tied pair, and whether it is the copy),
:func:`tied_end` (the end blocks ``[start, end)`` hold alone), :class:`TiedLink` (what the engine needs from
the transport: swap a tensor with the other end), :func:`sum_tied_grad`, and :class:`InMemoryTiedPair` for
in-process pipelines. Over the transport the link is ``wire_links.WireFabric.tied_link`` (stream kind ``tie``
between stage 0 rank 0 and the last stage's rank 0).

Each step, after the backward (and after the data-parallel replicas averaged their gradients) and before
clipping, the stage holding the embedding (stage 0, the owner) and the stage holding the head (the last, the
copy) swap their gradients of the weight and both set it to ``first + last``: the same operands in the same
order on both, so the sums are bit-identical. The copy starts as the embedding's tensor (``tie_blocks``), both
take the same clipped gradient through the same optimizer arithmetic, and so stay bit-identical on the same
kind of device (a CPU and a GPU may round the update differently: the copies then differ by rounding, and a
resume starts both from the embedding's tensor again): the training of one process holding one shared weight,
whose gradient is the same sum.
Clipping counts the weight once: the copy is not in the last stage's share of the global norm
(``StageModule.norm_parameters``). Checkpoints and exports store the owner's tensor only
(``arceusd/jobs/procs/reslice.py``). DiLoCo replicas would average the two copies over different rings (different
rounding), so a plan with both is refused (``StageEngine``).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from arceusd.models.build import tied_pair
from arceusd.models.config import ModelConfig
from arceusd.worker.collective import DEFAULT_TIMEOUT_S
from arceusd.worker.links import LinkError


@dataclass(frozen=True)
class TiedEnd:
    """A stage's end of a tied weight: the parameter's name in the ``StageModule`` (``blocks.0.wte.weight``)
    and whether it is the copy (the head's, on the last stage) rather than the owner (the embedding's)."""

    name: str
    copy: bool


def tied_end(config: ModelConfig, start: int, end: int) -> TiedEnd | None:
    """The end of the model's tied weight that blocks ``[start, end)`` hold without the other, or None (the
    model ties nothing, or the slice holds both ends or neither)."""
    pair = tied_pair(config)
    if pair is None:
        return None
    which = pair.split_by(start, end)
    if which is None:
        return None
    if which == "owner":
        return TiedEnd(f"blocks.{pair.owner}", copy=False)
    return TiedEnd(f"blocks.{pair.copy}", copy=True)


class TiedLink(Protocol):
    """This stage's link to the other end of the tied weight (blocking; the compute thread calls it once per
    step, after the backward)."""

    def exchange(self, tensor: torch.Tensor) -> torch.Tensor:
        """Send ``tensor`` to the other end and return the tensor it sent (the caller must not modify
        ``tensor`` afterwards)."""
        ...


def sum_tied_grad(param: nn.Parameter, link: TiedLink, copy: bool) -> None:
    """Set ``param.grad`` to the first stage's gradient plus the last stage's (a missing one counts as zero),
    added in that order on both ends."""
    own = param.grad.detach() if param.grad is not None else torch.zeros_like(param)
    other = link.exchange(own)
    if tuple(other.shape) != tuple(own.shape):
        raise LinkError(
            f"the other end of the tied weight sent a gradient of shape {list(other.shape)}, this stage holds "
            f"{list(own.shape)}: the two stages were built from different model configs"
        )
    other = other.to(own.device, own.dtype)
    param.grad = other + own if copy else own + other


class InMemoryTiedPair:
    """Both ends' links of one in-process pipeline (threads): ``end(copy=False)`` for the first stage,
    ``end(copy=True)`` for the last."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._boxes: dict[bool, queue.Queue[torch.Tensor]] = {False: queue.Queue(), True: queue.Queue()}

    def end(self, copy: bool) -> InMemoryTiedLink:
        return InMemoryTiedLink(self, copy)


class InMemoryTiedLink:
    """One end's :class:`TiedLink` on an :class:`InMemoryTiedPair`."""

    def __init__(self, pair: InMemoryTiedPair, copy: bool) -> None:
        self._pair = pair
        self._copy = copy

    def exchange(self, tensor: torch.Tensor) -> torch.Tensor:
        self._pair._boxes[not self._copy].put(tensor.detach().clone())
        try:
            return self._pair._boxes[self._copy].get(timeout=self._pair.timeout_s)
        except queue.Empty:
            raise LinkError(
                f"the {'last' if self._copy else 'first'} stage waited {self._pair.timeout_s}s for the other "
                "end's gradient of the tied weight"
            ) from None


__all__ = ["InMemoryTiedLink", "InMemoryTiedPair", "TiedEnd", "TiedLink", "sum_tied_grad", "tied_end"]
