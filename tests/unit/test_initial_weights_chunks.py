"""Signed chunks of the initial tensors a tensor-parallel split cuts (issue 30: a rank receives only its shard):
each chunk's digest, a split tensor's one digest over them, and a rank's shard assembled from the chunks that
cover it, equal to the slice the worker's split holds (``arceusd/models/hf/weights_chunks.py``; torch only in the
test, as the oracle: ``shard_hf_tensor``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import expected_tensors
from arceusd.models.hf.weights_check import read_header
from arceusd.models.hf.weights_chunks import (
    COLUMN_CHUNKS,
    ChunkError,
    Chunking,
    assemble_shard,
    check_chunk_digests,
    chunk_digests,
    chunking,
    chunks_root,
    rank_ranges,
    read_chunk,
    shard_shape,
    tp_split_table,
)
from arceusd.models.hf.weights_slice import DTYPE_BYTES
from arceusd.worker.hf_tp_tensors import hf_is_sharded, shard_hf_tensor
from arceusd.worker.tp_split import TPSplit
from tests.unit import hf_cases

# llama: 6 heads in 3 KV groups of 2; 200 MLP columns cut in 50 chunks of 4 (a rank's range may end inside one);
# qwen2: q/k/v biases; gpt2: fused c_attn, 4 heads, 48 columns (chunks of 1).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": (
        "llama",
        {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 200},
    ),
    "llama_bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2": ("qwen2", {"num_key_value_heads": 4}),
    "gpt2": ("gpt2", {"n_inner": 48}),
}
CASES: list[tuple[str, TPSplit]] = [
    ("llama", TPSplit((2, 1), (130, 70))),
    ("llama", TPSplit((1, 1, 1), (61, 70, 69))),
    ("llama_bias", TPSplit((1, 1), (30, 18))),
    ("qwen2", TPSplit((3, 1), (13, 27))),
    ("gpt2", TPSplit((3, 1), (16, 32))),
    ("gpt2", TPSplit((1, 1, 2), (20, 20, 8))),
]


def _config(name: str) -> HFModelConfig:
    model_type, overrides = CONFIGS[name]
    return hf_cases.config(model_type, **overrides)


def _weights(path: Path, cfg: HFModelConfig) -> dict[str, torch.Tensor]:
    """Random initial weights under the architecture's keys; one split tensor in bf16."""
    gen = torch.Generator().manual_seed(5)
    tensors = {k: torch.randn(shape, generator=gen) for k, (_, _, shape) in expected_tensors(cfg).items()}
    bf16 = next(k for k in sorted(tensors) if chunking(cfg, k) is not None)
    tensors[bf16] = tensors[bf16].to(torch.bfloat16)
    save_file(tensors, str(path))
    return tensors


def _raw(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


def _start(path: Path, key: str) -> int:
    """Where ``key``'s raw bytes start in the safetensors file ``path``."""
    raw = path.read_bytes()
    return 8 + int.from_bytes(raw[:8], "little") + int(read_header(path)[key]["data_offsets"][0])


def _itemsize(t: torch.Tensor) -> int:
    return DTYPE_BYTES["BF16" if t.dtype == torch.bfloat16 else "F32"]


def test_the_split_tensors_are_chunked_and_nothing_else() -> None:
    for name in CONFIGS:
        cfg = _config(name)
        for key, (index, local, _) in expected_tensors(cfg).items():
            c = chunking(cfg, key)
            assert (c is not None) == hf_is_sharded(local, cfg) == (local in tp_split_table(cfg)), key
            assert index not in (0, cfg.n_layer + 1) or c is None, key  # embedding, final norm and head whole


def test_chunk_counts_and_sizes_come_from_the_config() -> None:
    cfg = hf_cases.config(
        "llama", hidden_size=64, num_attention_heads=8, num_key_value_heads=2, intermediate_size=11008
    )
    up = chunking(cfg, "model.layers.0.mlp.up_proj.weight")
    assert up is not None and up.count == COLUMN_CHUNKS  # 64 blocks of 172 columns
    assert up.bounds[1] == 172 and up.bounds[-1] == 11008 and up.chunk_nbytes(0, 4) == 172 * 64 * 4
    down = chunking(cfg, "model.layers.0.mlp.down_proj.weight")
    assert down is not None and (down.dim, down.outer, down.inner) == (1, 64, 1)
    q = chunking(cfg, "model.layers.0.self_attn.q_proj.weight")
    k = chunking(cfg, "model.layers.0.self_attn.k_proj.weight")
    assert q is not None and k is not None
    assert (q.count, q.bounds[1]) == (2, 4 * 8) and (k.count, k.bounds[1]) == (2, 8)  # per KV group / KV head
    odd = chunking(hf_cases.config("llama", intermediate_size=130), "model.layers.0.mlp.gate_proj.weight")
    assert odd is not None and odd.bounds[1] == 3 and odd.bounds[-2:] == (129, 130) and odd.count == 44  # last: 1
    gpt2 = chunking(_config("gpt2"), "transformer.h.0.attn.c_attn.weight")
    assert gpt2 is not None and (gpt2.dim, gpt2.count) == (1, 3 * 4)  # each of q, k and v per head


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_chunk_digests_hash_each_chunks_bytes_and_the_root_hashes_them(tmp_path: Path, name: str) -> None:
    cfg = _config(name)
    path = tmp_path / "w.safetensors"
    tensors = _weights(path, cfg)
    checked = 0
    with path.open("rb") as f:
        for key, t in tensors.items():
            c = chunking(cfg, key)
            if c is None:
                continue
            digests = chunk_digests(_raw(t), c, _itemsize(t))
            for i in range(c.count):
                part = _raw(t.narrow(c.dim, c.bounds[i], c.bounds[i + 1] - c.bounds[i]))
                assert digests[i] == hashlib.sha256(part).hexdigest(), (key, i)
                assert read_chunk(f, _start(path, key), c, i, _itemsize(t)) == part, (key, i)
                assert len(part) == c.chunk_nbytes(i, _itemsize(t))
            raw = b"".join(bytes.fromhex(d) for d in digests)
            assert chunks_root(digests) == hashlib.sha256(raw).hexdigest()
            check_chunk_digests(key, digests, c, chunks_root(digests), "the leader")
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize(("name", "split"), CASES)
def test_a_ranks_shard_from_its_chunks_is_the_slice_its_split_holds(tmp_path: Path, name: str, split: TPSplit) -> None:
    """Every split tensor, every rank: the chunks covering its ranges, checked and cut, are byte for byte the
    worker's slice (``shard_hf_tensor``) of the whole tensor, of :func:`shard_shape`; what travels is the shard
    plus at most one partial chunk on each side of each range, the shard exactly where the split aligns."""
    cfg = _config(name)
    path = tmp_path / "w.safetensors"
    tensors = _weights(path, cfg)
    received = shards = 0
    with path.open("rb") as f:
        for key, t in tensors.items():
            c = chunking(cfg, key)
            if c is None:
                continue
            local = expected_tensors(cfg)[key][1]
            size, digests = _itemsize(t), chunk_digests(_raw(t), c, _itemsize(t))
            for rank in range(split.world_size):
                ranges = rank_ranges(c.by, cfg, split.heads, split.columns, rank)
                wanted = c.covering(ranges)
                chunks = {i: read_chunk(f, _start(path, key), c, i, size) for i in wanted}
                mine = assemble_shard(key, chunks, digests, c, size, ranges)
                expected = shard_hf_tensor(local, t, cfg, split, rank)
                assert tuple(expected.shape) == shard_shape(c, ranges), key
                assert mine == _raw(expected), (key, rank)
                sent = sum(len(b) for b in chunks.values())
                extra = sent - len(mine)
                widest = max(c.chunk_nbytes(i, size) for i in range(c.count))
                assert 0 <= extra <= 2 * len(ranges) * widest, (key, rank)
                if all(a in c.bounds and b in c.bounds for a, b in ranges):
                    assert extra == 0, (key, rank)
                received += sent
                shards += len(mine)
    whole = sum(len(_raw(t)) for k, t in tensors.items() if chunking(cfg, k) is not None)
    assert shards == whole  # the ranks' shards tile each split tensor exactly
    assert received < whole * 1.25


def _llama_up(tmp_path: Path) -> tuple[HFModelConfig, str, Chunking, dict[int, bytes], tuple[str, ...], Any]:
    cfg = _config("llama")
    path = tmp_path / "w.safetensors"
    tensors = _weights(path, cfg)
    key = "model.layers.1.mlp.up_proj.weight"
    c = chunking(cfg, key)
    assert c is not None
    ranges = rank_ranges(c.by, cfg, (2, 1), (130, 70), 1)
    with path.open("rb") as f:
        chunks = {i: read_chunk(f, _start(path, key), c, i, 4) for i in c.covering(ranges)}
    return cfg, key, c, chunks, chunk_digests(_raw(tensors[key]), c, 4), ranges


def test_a_tampered_short_or_missing_chunk_is_refused_with_one_line(tmp_path: Path) -> None:
    _, key, c, chunks, digests, ranges = _llama_up(tmp_path)
    first = min(chunks)
    tampered = dict(chunks)
    raw = bytearray(tampered[first])
    raw[3] ^= 0x10
    tampered[first] = bytes(raw)
    with pytest.raises(ChunkError) as info:
        assemble_shard(key, tampered, digests, c, 4, ranges, "the leader 0123456789ab")
    line = str(info.value)
    assert "\n" not in line and line.endswith("; refused")
    assert line.startswith(f"the leader 0123456789ab served chunk {first} of {key} not matching the job's signed")
    with pytest.raises(ChunkError, match=rf"served {len(chunks[first]) - 1} bytes as chunk {first} of .*; refused"):
        assemble_shard(key, {**chunks, first: chunks[first][:-1]}, digests, c, 4, ranges)
    with pytest.raises(ChunkError, match="this rank needs"):
        assemble_shard(key, {i: b for i, b in chunks.items() if i != first}, digests, c, 4, ranges)
    with pytest.raises(ChunkError, match="this rank needs"):  # a chunk it did not ask for is not taken either
        assemble_shard(key, {**chunks, 0: b"\0" * c.chunk_nbytes(0, 4)}, digests, c, 4, ranges)


def test_digests_a_peer_gives_must_be_the_configs_count_and_hash_to_the_signed_value(tmp_path: Path) -> None:
    _, key, c, _, digests, _ = _llama_up(tmp_path)
    signed = chunks_root(digests)
    with pytest.raises(ChunkError, match=f"gave {c.count - 1} chunk digests of {key}; the config cuts it in"):
        check_chunk_digests(key, digests[:-1], c, signed, "the leader")
    forged = ("0" * 64, *digests[1:])
    with pytest.raises(ChunkError, match="that do not match the job's signed digest; refused"):
        check_chunk_digests(key, forged, c, signed, "the leader")
