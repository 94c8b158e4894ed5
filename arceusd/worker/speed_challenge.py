"""The torch side of a speed challenge (:mod:`arceusd.jobs.judging.challenges`), run in a child process of the daemon.

``python -m arceusd.worker.speed_challenge solve SIZE ROUNDS THREADS KIND``: allocate, then print ``{"ready": true}``;
read one JSON line ``{"seed": HEX}``, compute every round's product and its digests (:func:`digests`) and print
``{"root": HEX}`` (the Merkle root over blocks of :data:`BLOCK_ROWS` rows' digests); read ``{"open": [LEAF,
...]}`` and print ``{"blocks": [HEX, ...], "proofs": [[HEX, ...], ...]}`` (each opened block's float32 digests
and its Merkle proof); then exit. A line that is not what it waits for ends it.

``python -m arceusd.worker.speed_challenge verify`` reads one JSON line ``{"size", "rounds", "seed", "open",
"blocks"}`` (blocks as hex of float32 digests) and prints ``{"error": E}``: the largest relative error of the
opened blocks against this process's own digests of those rows (inf for a block of the wrong length or with
non-finite values).

The matrices are a hash of (seed, round, matrix, row, column) (:func:`entries`): integer operations only, so
every device builds the same bits, and no structure a device could use to skip the products. A row's digest is
a nonlinear function of every value of the row's product (a sum of tanh), so it takes the whole product, yet
only a few bytes per row are hashed and sent (a fast device is not held back by hashing its output).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch

from arceusd.jobs.judging.challenges import (
    BLOCK_ROWS,
    check_size,
    leaf_count,
    leaf_hash,
    leaf_position,
    merkle_proof,
    merkle_root,
    seed_value,
)

_MUL = (0x9E3779B1 - (1 << 32), 0x2C1B3C6D, 0x297A2D39)  # odd 32-bit multipliers (lowbias32-style), signed


def _key(seed: int, round_: int, matrix: int) -> int:
    """A 31-bit key per (seed, round, matrix) (Python integers: no overflow)."""
    return (seed * 0x9E3779B97F4A7C15 + (round_ * 2 + matrix) * 0xBF58476D1CE4E5B9 + 1) % (1 << 64) >> 33


def entries(
    seed: int, round_: int, matrix: int, first_row: int, rows: int, size: int, device: torch.device
) -> torch.Tensor:
    """Rows ``first_row .. first_row + rows`` of matrix ``matrix`` (0: left, 1: right) of round ``round_``: values
    in [-0.5, 0.5) from a 32-bit integer hash of their position and the round's key (int32 arithmetic wraps the
    same way on every device)."""
    x = torch.arange(first_row * size, (first_row + rows) * size, dtype=torch.int32, device=device)
    x = x * _MUL[0] + _key(seed, round_, matrix)
    x ^= x >> 15
    x *= _MUL[1]
    x ^= x >> 12
    x *= _MUL[2]
    x ^= x >> 15
    return (x & 0xFFFFFF).to(torch.float32).mul_(2.0**-24).sub_(0.5).view(rows, size)


def digests(
    seed: int,
    round_: int,
    first_row: int,
    rows: int,
    size: int,
    device: torch.device,
    right: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``first_row .. first_row + rows`` of round ``round_``'s digest: for each row of the product of the
    round's two matrices, the sum of ``tanh(scale * value)`` over the row (float64 on the CPU). Nonlinear: no
    shortcut gives it without every value of the row; a few floats per row to hash instead of the whole row."""
    if right is None:
        right = entries(seed, round_, 1, 0, size, size, device)
    product = entries(seed, round_, 0, first_row, rows, size, device) @ right
    return torch.tanh(product.mul_(12.0 / math.sqrt(size))).sum(dim=1).to("cpu", torch.float64)


def as_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())


def solve(size: int, rounds: int, seed: int, device: torch.device) -> list[bytes]:
    """Every leaf's bytes (one block of :data:`BLOCK_ROWS` rows' digests, float32), round by round."""
    step = BLOCK_ROWS * 4
    leaves: list[bytes] = []
    for r in range(rounds):
        flat = as_bytes(digests(seed, r, 0, size, size, device))
        leaves.extend(flat[i : i + step] for i in range(0, len(flat), step))
    return leaves


def max_error(size: int, seed: int, opened: list[int], blocks: list[bytes]) -> float:
    """The largest relative error of ``blocks`` against this process's own digests of the ``opened`` leaves
    (only their rows: :data:`BLOCK_ROWS` rows of the left matrix times the round's right one); inf for a block
    of the wrong length or with a value that is not finite."""
    worst = 0.0
    cpu = torch.device("cpu")
    rights: dict[int, torch.Tensor] = {}
    for leaf, data in zip(opened, blocks, strict=True):
        if len(data) != BLOCK_ROWS * 4:
            return math.inf
        theirs = torch.frombuffer(bytearray(data), dtype=torch.float32).double()
        if not bool(torch.isfinite(theirs).all()):
            return math.inf
        r, first = leaf_position(leaf, size)
        if r not in rights:
            rights[r] = entries(seed, r, 1, 0, size, size, cpu)
        ours = digests(seed, r, first, BLOCK_ROWS, size, cpu, rights[r])
        norm = float(ours.norm())
        error = float((theirs - ours).norm()) / norm if norm > 0 else math.inf
        worst = max(worst, error)
    return worst


SOLVE_KINDS = ("cpu", "cuda", "mps")
"""The device kinds a challenge may be solved on: the kind of the offer this device lends (its ``devices`` config
key may keep a job off a GPU the machine has; the challenge must time what the job gets)."""


def _device(kind: str) -> torch.device:
    """``kind``'s device when torch has one here, else the CPU (an offer names only kinds its probe found)."""
    if kind == "cuda" and torch.cuda.is_available():
        return torch.device("cuda")
    if kind == "mps" and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    got = json.loads(line)
    if not isinstance(got, dict):
        sys.exit("expected a JSON object")
    return got


def _solve_main(size: int, rounds: int, threads: int, kind: str) -> None:
    torch.set_num_threads(threads)
    device = _device(kind)
    digests(1, 0, 0, BLOCK_ROWS, size, device)  # warm the kernels before the clock starts
    _say({"ready": True})
    seed = seed_value(str(_read()["seed"]))
    blocks = solve(size, rounds, seed, device)
    leaves = [leaf_hash(b) for b in blocks]
    _say({"root": merkle_root(leaves).hex()})
    opened = [int(i) for i in _read()["open"]]
    if not all(0 <= i < leaf_count(size, rounds) for i in opened):
        sys.exit("a leaf to open is out of range")
    _say(
        {
            "blocks": [blocks[i].hex() for i in opened],
            "proofs": [[h.hex() for h in merkle_proof(leaves, i)] for i in opened],
        }
    )


def _verify_main() -> None:
    torch.set_num_threads(1)
    got = _read()
    size, rounds = int(got["size"]), int(got["rounds"])
    if check_size(size, rounds):
        sys.exit(check_size(size, rounds))
    opened = [int(i) for i in got["open"]]
    blocks = [bytes.fromhex(str(b)) for b in got["blocks"]]
    _say({"error": max_error(size, seed_value(str(got["seed"])), opened, blocks)})


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["solve"] and len(args) == 5 and all(a.isdigit() for a in args[1:4]) and args[4] in SOLVE_KINDS:
        size, rounds, threads = (int(a) for a in args[1:4])
        why = check_size(size, rounds)
        if why:
            sys.exit(why)
        _solve_main(size, rounds, max(1, threads), args[4])
    elif args == ["verify"]:
        _verify_main()
    else:
        kinds = ", ".join(SOLVE_KINDS)
        sys.exit(
            f"usage: python -m arceusd.worker.speed_challenge solve SIZE ROUNDS THREADS KIND | verify (KIND: {kinds})"
        )


if __name__ == "__main__":
    main()
