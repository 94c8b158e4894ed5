"""Speed challenge bench: what a leader-timed challenge (``arceusd/jobs/judging/challenges.py``) costs, against plain
matrix products of the same work run in the same script (the baseline).

Usage: ``python bench/speed_challenge.py [--quick] [--threads N]``

For each device speed a challenge could be sized for (this machine's, and the sizes a 10x and a 100x claim would
get, with their rounds cut to this machine's 0.15 s), prints, as medians of a few runs:
- ``solve``: the member's work (hashed matrices, products, row digests, block hashes, the Merkle root) over
  plain ``a @ b`` products of the same sizes and count: how much slower than its matmul speed an honest device
  looks;
- ``verify``: the leader's check of the opened blocks (its own digests of those rows), over ``solve``: what
  checking costs the leader beside what answering costs the member.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from arceusd.jobs.judging import challenges  # noqa: E402
from arceusd.worker import speed_challenge  # noqa: E402

CPU = torch.device("cpu")


def median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def plain(size: int, rounds: int) -> None:
    a, b = torch.rand(size, size), torch.rand(size, size)
    for _ in range(rounds):
        a @ b


def measure(size: int, rounds: int, runs: int) -> tuple[float, float, float]:
    """(plain seconds, solve / plain, verify / solve) of one challenge shape."""
    seed = challenges.seed_value(challenges.new_seed())
    base = median_s(lambda: plain(size, rounds), runs)
    blocks: list[bytes] = []

    def solve() -> None:
        blocks[:] = speed_challenge.solve(size, rounds, seed, CPU)
        challenges.merkle_root([challenges.leaf_hash(b) for b in blocks])

    solved = median_s(solve, runs)
    opened = list(challenges.blocks_to_open(size, rounds))
    shown = [blocks[i] for i in opened]
    checking = median_s(lambda: speed_challenge.max_error(size, seed, opened, shown), runs)
    assert speed_challenge.max_error(size, seed, opened, shown) < challenges.TOLERANCE
    return base, solved / base, checking / solved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a stage worker's, by default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = 3 if args.quick else 7
    size0 = 1024
    rate = 2.0 * size0**3 * 4 / median_s(lambda: plain(size0, 4), runs)  # this machine's matmul FLOP/s
    print(f"matmul on {args.threads} thread(s): {rate / 1e9:.1f} GFLOP/s")
    print(f"{'offer':>10} {'size':>5} {'rounds':>6} {'plain s':>8} {'solve':>7} {'verify':>7}")
    for claim in (1, 10, 100):
        size, _ = challenges.challenge_size(rate * claim)
        rounds = max(1, round(rate * challenges.TARGET_S / (2.0 * size**3)))  # this machine's 0.15 s of work
        base, solve, check = measure(size, rounds, runs)
        print(f"{claim:>9}x {size:>5} {rounds:>6} {base:>8.3f} {solve:>6.2f}x {check:>6.2f}x")


if __name__ == "__main__":
    main()
