"""A stage's backward in two halves: the input's gradient now, the parameters' gradients later, no work twice.

Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", 2023) send the gradient of a
stage's input to the previous stage as soon as it is known and compute the parameters' gradients later, where
the stage would otherwise idle. ``torch.autograd.grad(root, x)`` computes only what leads to ``x`` (autograd
skips the branches that end in parameters), so the first half costs what it should. For the second half,
rerunning the backward restricted to the parameters would redo every node between the root and the
parameters. Instead, while the first half runs, a pre-hook on each *boundary* node (a node on the input's path
from which a parameter's branch leaves, e.g. the ``AddmmBackward`` of a linear layer) keeps the gradient flowing
into it; the second half starts at those nodes with the kept gradients and runs only the parameters' branches.
This is the graph surgery of ``torch/distributed/pipelining/_backward.py`` (``stage_backward_input`` /
``stage_backward_weight``), written again here because that module is private to torch and changes between
releases.

Same kernels on the same values, so the parameters' gradients equal one ``torch.autograd.backward``'s; they
accumulate into ``.grad`` like it, and the parameters' post-accumulate-grad hooks then run as autograd's would
(data-parallel replicas start all-reducing a bucket from them, ``replicas.py``). A stage whose input needs no
gradient (the first stage: token ids) has no first half: its whole backward is the second.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

Grads = tuple[torch.Tensor | None, ...]


def _node_of(t: torch.Tensor) -> Node | None:
    """The autograd node producing ``t``, or the gradient accumulator of a leaf that requires grad."""
    if t.grad_fn is not None:
        return t.grad_fn
    if not t.requires_grad:
        return None
    view = t.view_as(t)  # a leaf's accumulator is created lazily; a view's grad_fn points at it
    if view.grad_fn is None:  # pragma: no cover - only under torch.no_grad(), which the engine never uses here
        raise RuntimeError("cannot reach the gradient accumulator of a leaf under torch.no_grad()")
    acc: Node | None = view.grad_fn.next_functions[0][0]
    return acc


def _consumers(root: Node) -> dict[Node, list[Node]]:
    """For every node reachable from ``root``: the nodes whose backward feeds gradient into it (insertion
    ordered, so every walk below is deterministic)."""
    consumers: dict[Node, list[Node]] = {root: []}
    queue = deque([root])
    while queue:  # bounded: each node enters the queue once
        node = queue.popleft()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if nxt not in consumers:
                consumers[nxt] = []
                queue.append(nxt)
            consumers[nxt].append(node)
    return consumers


def _towards_root(
    starts: Iterable[Node], consumers: dict[Node, list[Node]], stop: dict[Node, None]
) -> tuple[dict[Node, None], dict[Node, None]]:
    """Nodes reached from ``starts`` walking towards the root without entering ``stop``; and the ``stop``
    nodes met on the way (ordered sets)."""
    closure: dict[Node, None] = {}
    met: dict[Node, None] = {}
    queue: deque[Node] = deque()
    for s in starts:
        if s not in closure:
            closure[s] = None
            queue.append(s)
    while queue:  # bounded: each node enters the closure once
        node = queue.popleft()
        for up in consumers.get(node, ()):
            if up in closure:
                continue
            if up in stop:
                met[up] = None
                continue
            closure[up] = None
            queue.append(up)
    return closure, met


@dataclass
class _Group:
    """Parameters whose branches leave the input's path at the same boundary nodes, and the gradients that
    flowed into those nodes in the first half."""

    params: dict[Node, None]
    boundary: list[Node]
    kept: list[Grads | None] = field(default_factory=list)


@dataclass
class PendingWeights:
    """The second half of a split backward: ``run()`` accumulates the parameters' gradients, once."""

    _groups: list[_Group]
    _params: dict[Node, torch.nn.Parameter]
    _whole: tuple[torch.Tensor, torch.Tensor | None] | None = None
    """Set when there was no first half: the root and its gradient, for one plain backward."""
    done: bool = False

    def run(self) -> None:
        if self.done:
            raise RuntimeError("the parameters' gradients of this backward were already computed")
        self.done = True
        if self._whole is not None and self._params:  # no parameter (a frozen first stage): nothing to compute
            root, grad = self._whole
            torch.autograd.backward(root, grad, inputs=list(self._params.values()))
        for group in self._groups:
            self._run_group(group)
        self._groups.clear()
        self._whole = None

    def _run_group(self, group: _Group) -> None:
        edges: list[GradientEdge] = []
        grads: list[torch.Tensor] = []
        for node, kept in zip(group.boundary, group.kept, strict=True):
            for k, g in enumerate(kept or ()):
                if g is not None:
                    edges.append(GradientEdge(node, k))
                    grads.append(g)
        if not edges:
            return  # no gradient reached this group's boundary (a branch whose output went unused)
        handles = []
        if len(group.boundary) > 1:
            # A boundary node can lie upstream of another: pin every boundary's incoming gradient to the kept
            # value, so what one passes on is not added again to what another already received.
            for node, kept in zip(group.boundary, group.kept, strict=True):
                handles.append(node.register_prehook(lambda _grads, pinned=kept: pinned))
        try:
            targets = list(group.params)
            dws = torch.autograd.grad(edges, [GradientEdge(p, 0) for p in targets], grads, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        with torch.no_grad():
            for node, dw in zip(targets, dws, strict=True):
                if dw is None:
                    continue
                param = self._params[node]
                if param.grad is None:
                    param.grad = dw
                else:
                    param.grad += dw
                _post_accumulate(param)


def _post_accumulate(param: torch.nn.Parameter) -> None:
    """Run ``param``'s post-accumulate-grad hooks, as autograd does after accumulating into ``.grad`` (torch
    keeps them in ``_post_accumulate_grad_hooks``; absent when none was registered)."""
    hooks = getattr(param, "_post_accumulate_grad_hooks", None)
    for hook in list(hooks.values()) if hooks else ():
        hook(param)


def _groups(
    param_nodes: Iterable[Node], consumers: dict[Node, list[Node]], input_path: dict[Node, None]
) -> list[_Group]:
    """Group the parameters by the boundary nodes where their branches join the input's path."""
    by_boundary: dict[Node, _Group] = {}
    for pnode in param_nodes:
        if pnode not in consumers:
            continue  # not used by this micro-batch's graph
        _, met = _towards_root([pnode], consumers, input_path)
        group = _Group(params={pnode: None}, boundary=list(met))
        for b in met:
            other = by_boundary.get(b)
            if other is not None and other is not group:  # shares a boundary node: one group
                other.params.update(group.params)
                other.boundary += [n for n in group.boundary if n not in other.boundary]
                for n in group.boundary:
                    by_boundary[n] = other
                group = other
        for n in group.boundary:
            by_boundary[n] = group
    unique: dict[int, _Group] = {id(g): g for g in by_boundary.values()}
    return list(unique.values())


def backward_input(
    root: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor | None, params: Sequence[torch.nn.Parameter]
) -> tuple[torch.Tensor | None, PendingWeights]:
    """The first half: the gradient of the stage input ``x`` from ``root`` seeded with ``grad`` (``None`` for a
    scalar loss), and the pending second half for ``params``. ``x`` that needs no gradient (or ``None``) has
    no first half: the result is ``None`` and the whole backward is pending. The graph stays alive until the
    second half ran."""
    param_nodes: dict[Node, torch.nn.Parameter] = {}
    for p in params:
        node = _node_of(p) if p.requires_grad else None
        if node is not None:
            param_nodes[node] = p
    if x is None or not x.requires_grad:
        return None, PendingWeights([], param_nodes, _whole=(root, grad))
    root_node = _node_of(root)
    x_node = _node_of(x)
    if root_node is None or x_node is None:
        raise ValueError("the backward's root does not depend on the stage input: nothing to differentiate")
    consumers = _consumers(root_node)
    if x_node not in consumers:
        raise ValueError("the stage input does not reach the backward's root: its gradient would be missing")
    input_path, _ = _towards_root([x_node], consumers, {})
    groups = _groups(param_nodes, consumers, input_path)
    handles = []
    for group in groups:
        group.kept = [None] * len(group.boundary)
        for k, node in enumerate(group.boundary):

            def keep(grads: Grads, group: _Group = group, k: int = k) -> None:
                group.kept[k] = grads

            handles.append(node.register_prehook(keep))
    try:
        (gx,) = torch.autograd.grad(root, x, grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return gx, PendingWeights(groups, param_nodes)
