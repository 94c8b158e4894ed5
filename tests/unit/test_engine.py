"""Pipeline (+ tensor-parallel) training equals a plain PyTorch loop, and each stage holds only its slice.

Stages run concurrently in threads over the in-memory ``Links`` / ``Collective``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

from arceusd.models.build import build_reference_model, loss_mean, num_blocks
from arceusd.models.config import GPTConfig, MLPConfig, ModelConfig
from arceusd.worker.collective import InMemoryAllReduce, TimedCollective
from arceusd.worker.engine import Compression, EngineConfig, StageEngine
from arceusd.worker.links import InMemoryFabric
from arceusd.worker.optim import AdamWConfig, LRSchedule, OptimizerConfig, SGDConfig
from arceusd.worker.pending_step import StepResult
from arceusd.worker.schedule import ScheduleKind, WeightGrad, max_in_flight
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.tensor_parallel import TPSplit, TPTransformerBlock, gather_transformer_block
from arceusd.worker.tied import InMemoryTiedPair

MLP = MLPConfig((32, 16, 12, 10))
GPT = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65)
SEED = 1234
STEPS = 3
UNEVEN_TP = TPSplit(heads=(3, 1), columns=(96, 32))

Layout = Sequence[tuple[int, int, TPSplit | None]]


@dataclass(frozen=True)
class Case:
    model: ModelConfig
    layout: Layout
    micro_batches: int
    batch: int


def _batches(model: ModelConfig, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(99)
    out = []
    for _ in range(STEPS):
        if isinstance(model, MLPConfig):
            x = torch.randn(batch, model.layer_sizes[0], generator=gen)
            y = torch.randint(0, model.layer_sizes[-1], (batch,), generator=gen)
        else:
            assert isinstance(model, GPTConfig)
            x = torch.randint(0, model.vocab_size, (batch, model.block_size), generator=gen)
            y = torch.randint(0, model.vocab_size, (batch, model.block_size), generator=gen)
        out.append((x, y))
    return out


def prefixed(name: str) -> Callable[[str], str]:
    """An ``assert_close`` message that names the parameter ``name``."""
    return lambda message: f"{name}: {message}"


def _torch_optimizer(config: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if isinstance(config, SGDConfig):
        return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def reference_run(
    case: Case, opt: OptimizerConfig, lr: LRSchedule, clip: float | None
) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    model = build_reference_model(case.model, SEED)
    optimizer = _torch_optimizer(opt, model)
    losses, norms = [], []
    for step, (x, y) in enumerate(_batches(case.model, case.batch)):
        for g in optimizer.param_groups:
            g["lr"] = lr(step)
        optimizer.zero_grad()
        loss = loss_mean(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, norms, {n: p.detach() for n, p in model.named_parameters()}


def build_engines(
    case: Case,
    schedule: ScheduleKind,
    opt: OptimizerConfig,
    lr: LRSchedule | None,
    clip: float | None,
    compression: Compression | None = None,
    autocast_bf16: bool = False,
    defer_weights: bool = True,
    devices: Sequence[str] | None = None,
    group_timers: bool = False,
    max_in_flight: int = 0,
) -> list[list[StageEngine]]:
    """``devices``: each stage's torch device (all its ranks alike); None: all on the CPU. ``group_timers``: a
    tensor-parallel rank's group is a :class:`TimedCollective` and its engine reports ``group_wait_s``."""
    fabric = InMemoryFabric([1 if split is None else split.world_size for _, _, split in case.layout], timeout_s=20)
    engines: list[list[StageEngine]] = []
    tied = InMemoryTiedPair(timeout_s=20)  # a stock LM's tied embedding and head on two stages
    for s, (start, end, split) in enumerate(case.layout):
        group = InMemoryAllReduce(split.world_size, timeout_s=20) if split is not None else None
        ranks = []
        for r in range(1 if split is None else split.world_size):
            view = group.rank_view(r) if group else None
            timer = TimedCollective(view) if view is not None and group_timers else None
            module = build_stage(case.model, SEED, StageSpec(start, end, split, r), timer or view)
            config = EngineConfig(
                stage=s,
                num_stages=len(case.layout),
                num_micro_batches=case.micro_batches,
                schedule=schedule,
                optimizer=opt,
                lr_schedule=lr,
                max_grad_norm=clip,
                autocast_bf16=autocast_bf16,
                defer_weights=defer_weights,
                device=devices[s] if devices is not None else "cpu",
                max_in_flight=max_in_flight,
            )
            link = tied.end(module.tied.copy) if module.tied is not None else None
            ranks.append(StageEngine(module, fabric.links(s, r), config, compression, group_timer=timer, tied=link))
        engines.append(ranks)
    return engines


def drive(engines: list[list[StageEngine]], batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[StepResult]:
    """Run every engine in its own thread for all batches; return stage 0 rank 0's results."""
    results: dict[tuple[int, int], list[StepResult]] = {}
    errors: list[BaseException] = []
    last = len(engines) - 1

    def work(s: int, r: int, engine: StageEngine) -> None:
        try:
            out = []
            for x, y in batches:
                out.append(engine.run_step(x if s == 0 else None, y if s == last else None))
            results[(s, r)] = out
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(s, r, e), daemon=True)
        for s, ranks in enumerate(engines)
        for r, e in enumerate(ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    assert all(not t.is_alive() for t in threads), "a stage hung"
    ref = results[(0, 0)]
    for out in results.values():  # every stage and rank reports the same loss
        assert [o.loss for o in out] == [o.loss for o in ref]
    return ref


def gathered_params(case: Case, engines: list[list[StageEngine]]) -> dict[str, torch.Tensor]:
    full: dict[str, torch.Tensor] = {}
    for ranks in engines:
        lead = ranks[0].module
        for key, block in lead.blocks.items():
            if isinstance(block, TPTransformerBlock):
                assert isinstance(case.model, GPTConfig)
                split = next(sp for a, b, sp in case.layout if a <= int(key) < b)
                assert split is not None
                shards = [e.module.blocks[key] for e in ranks]
                assert all(isinstance(sh, TPTransformerBlock) for sh in shards)
                block = gather_transformer_block(shards, case.model, split)  # type: ignore[arg-type]
            for n, p in block.named_parameters():
                full[f"{key}.{n}"] = p.detach()
    return full


CASES = {
    "mlp-2": Case(MLP, [(0, 1, None), (1, 3, None)], micro_batches=4, batch=10),
    "mlp-3": Case(MLP, [(0, 1, None), (1, 2, None), (2, 3, None)], micro_batches=4, batch=10),
    "gpt-2": Case(GPT, [(0, 2, None), (2, 4, None)], micro_batches=3, batch=5),
    "gpt-3": Case(GPT, [(0, 1, None), (1, 3, None), (3, 4, None)], micro_batches=3, batch=5),
    "gpt-2-tp": Case(GPT, [(0, 2, None), (2, 4, UNEVEN_TP)], micro_batches=3, batch=5),
    "gpt-3-tp": Case(GPT, [(0, 1, None), (1, 3, UNEVEN_TP), (3, 4, None)], micro_batches=3, batch=5),
}
OPTIMIZERS: dict[str, OptimizerConfig] = {
    "sgd": SGDConfig(lr=0.05, momentum=0.9),
    "adamw": AdamWConfig(lr=3e-3, weight_decay=0.1),
}


@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("schedule", list(ScheduleKind))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_pipeline_equals_plain_training(case_name: str, schedule: ScheduleKind, opt_name: str) -> None:
    case, opt = CASES[case_name], OPTIMIZERS[opt_name]
    lr = LRSchedule(max_lr=opt.lr, min_lr=opt.lr / 10, warmup_steps=1, decay_steps=3)
    clip = 0.5
    ref_losses, ref_norms, ref_params = reference_run(case, opt, lr, clip)
    engines = build_engines(case, schedule, opt, lr, clip)
    results = drive(engines, _batches(case.model, case.batch))
    assert [r.step for r in results] == list(range(STEPS))
    assert [r.lr for r in results] == [lr(s) for s in range(STEPS)]
    torch.testing.assert_close(torch.tensor([r.loss for r in results]), torch.tensor(ref_losses), rtol=0, atol=1e-5)
    norms = [r.grad_norm for r in results]
    assert all(n is not None for n in norms)
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), rtol=1e-5, atol=1e-5)
    assert max(ref_norms) > clip  # clipping actually engaged
    params = gathered_params(case, engines)
    assert set(params) == set(ref_params)
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5, msg=prefixed(name))
    # replicated tensor-parallel parameters stayed bit-identical across ranks
    for ranks in engines:
        for e in ranks[1:]:
            lead = dict(ranks[0].module.named_parameters())
            for n, p in e.module.named_parameters():
                if p.shape == lead[n].shape and ("ln_" in n or n.endswith("c_proj.bias") or "wte" in n):
                    assert torch.equal(p, lead[n]), n


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
@pytest.mark.parametrize("case_name", ["mlp-2", "gpt-2", "gpt-3-tp"])
@pytest.mark.parametrize("schedule", list(ScheduleKind))
def test_a_job_mixing_cuda_and_cpu_stages_equals_plain_training(case_name: str, schedule: ScheduleKind) -> None:
    """The first stage on CUDA, the others on the CPU: activations and gradients cross devices both ways (the
    links carry whatever device the sender had; the receiver moves them to its own)."""
    case, opt = CASES[case_name], OPTIMIZERS["sgd"]
    ref_losses, _, ref_params = reference_run(case, opt, LRSchedule(opt.lr, opt.lr), None)
    devices = ["cuda"] + ["cpu"] * (len(case.layout) - 1)
    engines = build_engines(case, schedule, opt, None, None, devices=devices)
    assert next(engines[0][0].module.parameters()).device.type == devices[0]
    results = drive(engines, _batches(case.model, case.batch))
    torch.testing.assert_close(torch.tensor([r.loss for r in results]), torch.tensor(ref_losses), rtol=0, atol=1e-5)
    params = gathered_params(case, engines)
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name].cpu(), p, rtol=0, atol=1e-5, msg=prefixed(name))


def test_each_of_three_stages_holds_at_most_half_of_the_model() -> None:
    layout = [(0, 1, None), (1, 2, None), (2, 4, None)]
    case = Case(GPT, layout, micro_batches=2, batch=4)
    opt = AdamWConfig(lr=1e-3)
    engines = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, None, None)
    drive(engines, _batches(GPT, 4))  # materialises optimizer state
    full = build_reference_model(GPT, SEED)
    full_bytes = 3 * sum(p.numel() * p.element_size() for p in full.parameters())  # params + AdamW m, v
    for (start, end, _), ranks in zip(layout, engines, strict=True):
        engine = ranks[0]
        held = engine.param_bytes() + engine.optimizer_state_bytes()
        assert 0 < held <= full_bytes / 2
        assert engine.optimizer_state_bytes() == 2 * engine.param_bytes()
        assert sorted(int(k) for k in engine.module.blocks) == list(range(start, end))
    assert num_blocks(GPT) == 4


def test_compression_hook_is_applied_to_every_sent_tensor() -> None:
    calls = {"encode": 0, "decode": 0}

    def encode(t: torch.Tensor) -> torch.Tensor:
        calls["encode"] += 1
        return t.to(torch.bfloat16)

    def decode(t: torch.Tensor) -> torch.Tensor:
        calls["decode"] += 1
        return t.to(torch.float32)

    case = CASES["mlp-3"]
    opt = SGDConfig(lr=0.05)
    engines = build_engines(case, ScheduleKind.GPIPE, opt, None, None, Compression(encode, decode))
    results = drive(engines, _batches(MLP, case.batch)[:1])
    ref_losses, _, _ = reference_run(case, opt, LRSchedule(max_lr=0.05), None)
    # 2 boundaries x 4 micro-batches x (activation + grad) sends, each decoded once on the receiver
    assert calls == {"encode": 16, "decode": 16}
    assert results[0].loss == pytest.approx(ref_losses[0], abs=2e-2)  # bf16 wire: close, not exact


def test_bf16_autocast_trains_close_to_fp32() -> None:
    case = CASES["gpt-2"]
    opt = AdamWConfig(lr=3e-3)
    engines = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, None, None, autocast_bf16=True)
    results = drive(engines, _batches(GPT, case.batch))
    ref_losses, _, _ = reference_run(case, opt, LRSchedule(max_lr=3e-3), None)
    assert all(abs(r.loss - ref) < 5e-2 for r, ref in zip(results, ref_losses, strict=True))
    assert any(r.loss != ref for r, ref in zip(results, ref_losses, strict=True))


def test_wrong_feeding_is_rejected() -> None:
    engines = build_engines(CASES["mlp-2"], ScheduleKind.GPIPE, SGDConfig(), None, None)
    x, y = _batches(MLP, 10)[0]
    with pytest.raises(ValueError, match="targets go to the last stage"):
        engines[0][0].run_step(x, y)
    with pytest.raises(ValueError, match="inputs go to the first stage"):
        engines[1][0].run_step(x, y)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_resume_from_state_tensors_continues_exactly(opt_name: str) -> None:
    case, opt = CASES["gpt-3-tp"], OPTIMIZERS[opt_name]
    lr = LRSchedule(max_lr=opt.lr, min_lr=opt.lr / 10, warmup_steps=1, decay_steps=3)
    batches = _batches(GPT, case.batch)
    straight = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, lr, 0.5)
    straight_results = drive(straight, batches)
    first = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, lr, 0.5)
    drive(first, batches[:2])
    shards = [[{k: v.clone() for k, v in e.state_tensors().items()} for e in ranks] for ranks in first]
    resumed = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, lr, 0.5)
    for ranks, saved in zip(resumed, shards, strict=True):
        for e, state in zip(ranks, saved, strict=True):
            e.load_state_tensors(state, step=2)
    last = drive(resumed, batches[2:])
    assert last[0].step == 2 and last[0].loss == straight_results[2].loss
    for a, b in zip(gathered_params(case, straight).items(), gathered_params(case, resumed).items(), strict=True):
        assert a[0] == b[0] and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="does not belong"):
        resumed[0][0].load_state_tensors({"param.blocks.9.x": torch.zeros(1)}, step=0)


@pytest.mark.parametrize("kind", [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B])
@pytest.mark.parametrize("case_name", ["mlp-3", "gpt-3", "gpt-3-tp"])
def test_deferred_weights_change_no_result(case_name: str, kind: ScheduleKind) -> None:
    """Backwards that send the input's gradient first and compute the weights' gradients later
    (``split_backward.py``) give the whole backwards' results: in 1F1B bit for bit (the deferred ones are the
    last, so the gradients are summed in the same order); in GPipe (the first ones are deferred, so their
    gradients are added last) up to the rounding of that sum. A tensor-parallel stage runs them whole."""
    case, opt = CASES[case_name], OPTIMIZERS["adamw"]
    lr = LRSchedule(max_lr=opt.lr)
    runs = []
    for defer in (True, False):
        engines = build_engines(case, kind, opt, lr, 0.5, defer_weights=defer)
        split = [a for a in engines[-1][0]._schedule() if isinstance(a, WeightGrad)]
        assert bool(split) == defer  # the case really defers something
        results = drive(engines, _batches(case.model, case.batch))
        runs.append(([(r.loss, r.grad_norm) for r in results], gathered_params(case, engines)))
    (split_results, split_params), (whole_results, whole_params) = runs
    assert set(split_params) == set(whole_params)
    if kind is ScheduleKind.ONE_F_ONE_B:
        assert split_results == whole_results
        for name, tensor in split_params.items():
            assert torch.equal(tensor, whole_params[name]), name
        return
    assert split_results[0][0] == whole_results[0][0]  # the first loss comes before any update
    for (loss_a, norm_a), (loss_b, norm_b) in zip(split_results, whole_results, strict=True):
        assert loss_a == pytest.approx(loss_b, rel=1e-6) and norm_a == pytest.approx(norm_b, rel=1e-5)
    for name, tensor in split_params.items():  # AdamW turns the rounding of a ~0 gradient (a key's bias) into ~lr
        torch.testing.assert_close(tensor, whole_params[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case_name", ["mlp-3", "gpt-3-tp"])
def test_capped_1f1b_holds_fewer_micro_batches_and_trains_the_same_bits(case_name: str) -> None:
    """A plan's ``in_flight_cap`` (a model that fits its devices no other way): each stage stashes at most that
    many micro-batches, and the job trains exactly what uncapped 1F1B does (same forwards and backwards in the
    same micro-batch order; neither defers weights here, as a capped schedule does not)."""
    case, opt = CASES[case_name], OPTIMIZERS["adamw"]
    lr = LRSchedule(max_lr=opt.lr)
    runs = []
    for cap in (0, 1, 2):
        engines = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, lr, 0.5, defer_weights=False, max_in_flight=cap)
        held = [max_in_flight(ranks[0]._schedule()) for ranks in engines]
        if cap:
            assert max(held) == cap, held
        else:
            assert max(held) > 2, held  # the uncapped first stage holds more: the cap changes the schedule
        results = drive(engines, _batches(case.model, case.batch))
        runs.append(([(r.loss, r.grad_norm) for r in results], gathered_params(case, engines)))
    (figures, params), *capped = runs
    for capped_figures, capped_params in capped:
        assert capped_figures == figures
        assert all(torch.equal(tensor, capped_params[name]) for name, tensor in params.items())


def test_step_results_say_how_long_each_stage_waited_on_its_links() -> None:
    """Every stage of a pipeline waits at least once per step (the last for its first activation, the others
    for a gradient): ``wait_s`` counts it, ``optimizer_s`` the optimizer step, both inside the step."""
    case, opt = CASES["gpt-2"], OPTIMIZERS["adamw"]
    engines = build_engines(case, ScheduleKind.ONE_F_ONE_B, opt, LRSchedule(max_lr=opt.lr), 0.5)
    results = drive(engines, _batches(case.model, case.batch))
    assert all(r.wait_s > 0 and r.optimizer_s > 0 for r in results)
    alone = build_engines(
        Case(GPT, [(0, 4, None)], micro_batches=3, batch=5),
        ScheduleKind.ONE_F_ONE_B,
        opt,
        LRSchedule(max_lr=opt.lr),
        0.5,
    )
    solo = drive(alone, _batches(GPT, 5))
    assert all(r.optimizer_s > 0 for r in solo)
    assert all(r.wait_s < 0.05 for r in solo)  # one stage never waits for a neighbour
