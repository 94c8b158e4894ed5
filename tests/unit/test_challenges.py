"""Leader-timed speed challenges (issue #19: a member's claims are measured on the leader's own clock, not taken
from its word or its neighbours'): sizes, the Merkle commitment, the judgement, and the torch child that solves
and checks them, run as the daemon runs it (a process speaking JSON lines)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from arceusd.jobs.judging import challenges, claims
from arceusd.jobs.judging.challenges import Timed
from arceusd.worker import speed_challenge
from tests.unit.test_neighbour_timing import lw, plan_of

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.mark.parametrize("offered", [1e8, 3e10, 1e11, 5e12, claims.MAX_OFFER_FLOPS])
def test_a_challenge_is_about_its_target_seconds_at_the_offered_speed(offered: float) -> None:
    size, rounds = challenges.challenge_size(offered)
    assert challenges.check_size(size, rounds) is None
    seconds = challenges.challenge_flops(size, rounds) / offered
    if rounds < challenges.MAX_ROUNDS and size > challenges.SIZES[0]:
        assert challenges.TARGET_S <= seconds < 1.6 * challenges.TARGET_S, (size, rounds, seconds)
    assert challenges.MIN_WAIT_S <= challenges.wait_for(offered, size, rounds) <= challenges.MAX_WAIT_S


def test_shapes_a_member_refuses() -> None:
    assert challenges.check_size(300, 1) and challenges.check_size(512, 0)
    assert challenges.check_size(512, challenges.MAX_ROUNDS + 1) and challenges.check_size(8192, 1)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13, 64, 100])
def test_every_leaf_proves_its_place_and_nothing_else_does(count: int) -> None:
    leaves = [challenges.leaf_hash(bytes([i, i >> 8])) for i in range(count)]
    root = challenges.merkle_root(leaves)
    for i, leaf in enumerate(leaves):
        proof = challenges.merkle_proof(leaves, i)
        assert challenges.verify_proof(leaf, i, count, proof, root)
        assert not challenges.verify_proof(challenges.leaf_hash(b"forged"), i, count, proof, root)
        assert not challenges.verify_proof(leaf, i, count, [*proof, b"\0" * 32], root)
        if count > 1:
            assert not challenges.verify_proof(leaf, (i + 1) % count, count, proof, root)
            assert not challenges.verify_proof(leaf, i, count, proof[:-1], root)
    assert not challenges.verify_proof(leaves[0], count, count, [], root)
    with pytest.raises(ValueError):
        challenges.merkle_root([])


def test_opened_blocks_are_distinct_leaves_of_the_challenge() -> None:
    opened = challenges.blocks_to_open(512, 3)
    assert len(set(opened)) == challenges.OPENED and all(0 <= i < challenges.leaf_count(512, 3) for i in opened)
    assert len(challenges.blocks_to_open(256, 1, count=100)) == challenges.leaf_count(256, 1)


def _timed(offered: float, slowdown: float, why: str = "") -> Timed:
    size, rounds = challenges.challenge_size(offered)
    work = challenges.challenge_flops(size, rounds)
    return Timed(offered, work, slowdown * work / offered, why)


def test_a_member_is_judged_against_how_the_others_ran_beside_the_job() -> None:
    busy = {"L": _timed(1e11, 3.0), "b": _timed(1e11, 2.5), "c": _timed(1e11, 3.5)}  # a loaded machine: all alike
    assert all(challenges.challenge_factor(busy, p) is None for p in busy)
    liar = {**busy, "c": _timed(1e13, 100.0)}
    assert challenges.challenge_factor(liar, "c") == pytest.approx(100.0 / 2.75)
    assert challenges.challenge_factor(liar, "b") is None  # a liar among the others only makes them lenient
    assert challenges.challenge_factor({"c": liar["c"]}, "c") is None  # nobody to judge it against
    forged = {**busy, "c": _timed(1e13, 0.01, why="block 3 is not the one its root committed to")}
    assert challenges.challenge_factor(forged, "c") == claims.MAX_DISCOUNT
    assert forged["c"].measured_flops == 0.0 and forged["c"].summary()["failed"]
    # a few milliseconds over the offer are round trips and pipes, not a lie
    quick = {**busy, "c": Timed(1e13, 1e11, 0.2)}
    assert quick["c"].slowdown == pytest.approx(20.0) and challenges.challenge_factor(quick, "c") is None
    assert challenges.worth_confirming(7.0) and not challenges.worth_confirming(50.0)


def test_a_challenge_catches_what_word_against_word_cannot() -> None:
    """An end of the pipeline next to a member that does not lead: it overclaims, says it kept to its offer and
    that it waited on its neighbour; its neighbour (honest) says it waited on it. The neighbours' view cannot
    tell them apart; the leader's own timing of each can."""
    plan = plan_of(("L",), ("b",), ("h",))
    waits = lw({"L": (0.0, 2.0), "b": (0.0, 1.9), "h": (1.9, 0.0)})
    reported = {"L": (0.05, 0.05), "b": (0.05, 0.05), "h": (0.05, 0.05)}  # (seconds, predicted)
    seen = claims.seen_by_neighbours(plan, waits, {p: t[0] for p, t in reported.items()}, "L", 2.0)
    judged = claims.judged_times(reported, seen)
    assert claims.overclaim(judged, "h") is None  # word against word: the smaller wins
    timed = {"L": _timed(1e11, 2.0), "b": _timed(1e11, 2.2), "h": _timed(1e13, 100.0)}
    assert challenges.challenge_factor(timed, "h") == pytest.approx(100.0 / 2.1)
    assert challenges.challenge_factor(timed, "b") is None


def test_the_matrices_are_the_same_bits_whoever_builds_them() -> None:
    a = speed_challenge.entries(12345, 3, 1, 0, 256, 256, CPU)
    assert torch.equal(a, speed_challenge.entries(12345, 3, 1, 0, 256, 256, CPU))
    assert torch.equal(a[16:48], speed_challenge.entries(12345, 3, 1, 16, 32, 256, CPU))  # rows alone, alike
    assert not torch.equal(a, speed_challenge.entries(12346, 3, 1, 0, 256, 256, CPU))
    assert not torch.equal(a, speed_challenge.entries(12345, 3, 0, 0, 256, 256, CPU))
    assert not torch.equal(a, speed_challenge.entries(12345, 2, 1, 0, 256, 256, CPU))
    assert float(a.min()) >= -0.5 and float(a.max()) < 0.5 and abs(float(a.mean())) < 0.01
    assert 0.07 < float(a.var()) < 0.1  # uniform on [-0.5, 0.5): 1/12


def test_solved_blocks_prove_themselves_and_a_wrong_block_is_found() -> None:
    size, rounds, seed = 256, 3, 99
    blocks = speed_challenge.solve(size, rounds, seed, CPU)
    assert len(blocks) == challenges.leaf_count(size, rounds) and all(
        len(b) == challenges.BLOCK_ROWS * 4 for b in blocks
    )
    leaves = [challenges.leaf_hash(b) for b in blocks]
    root = challenges.merkle_root(leaves)
    opened = list(challenges.blocks_to_open(size, rounds))
    shown = [blocks[i] for i in opened]
    assert all(
        challenges.verify_proof(challenges.leaf_hash(b), i, len(leaves), challenges.merkle_proof(leaves, i), root)
        for i, b in zip(opened, shown, strict=True)
    )
    assert speed_challenge.max_error(size, seed, opened, shown) < 1e-5  # 16 rows alone give the same digests
    zeros = [bytes(len(shown[0])), *shown[1:]]
    assert speed_challenge.max_error(size, seed, opened, zeros) == pytest.approx(1.0)
    assert speed_challenge.max_error(size, seed + 1, opened, shown) > 0.5  # another seed's products
    assert speed_challenge.max_error(size, seed, opened, [shown[0][:-4], *shown[1:]]) == float("inf")
    nan = bytearray(shown[0])
    nan[:4] = bytes.fromhex("0000c07f")
    assert speed_challenge.max_error(size, seed, opened, [bytes(nan), *shown[1:]]) == float("inf")


def test_a_digest_takes_every_value_of_its_row() -> None:
    """Change one value of one row of the left matrix and that row's digest moves beyond the tolerance, the
    others not at all: a device that skipped part of a row would be found."""
    size, seed = 256, 5
    right = speed_challenge.entries(seed, 0, 1, 0, size, size, CPU)
    left = speed_challenge.entries(seed, 0, 0, 0, challenges.BLOCK_ROWS, size, CPU)
    scale = 12.0 / size**0.5
    honest = torch.tanh((left @ right) * scale).sum(dim=1).double()
    assert torch.allclose(honest, speed_challenge.digests(seed, 0, 0, challenges.BLOCK_ROWS, size, CPU), atol=1e-4)
    moved = 0
    for col in range(0, size, 37):
        skipped = left.clone()
        skipped[3, col] = 0.0
        other = torch.tanh((skipped @ right) * scale).sum(dim=1).double()
        assert torch.equal(other[:3], honest[:3]) and torch.equal(other[4:], honest[4:])
        moved += float((other[3] - honest[3]).abs() / honest.norm()) > challenges.TOLERANCE / 10
    assert moved >= size // 37 - 1


def _line(proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, object]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    assert line and time.monotonic() < deadline, "the child said nothing"
    got = json.loads(line)
    assert isinstance(got, dict)
    return got


def test_the_child_process_solves_opens_and_checks_as_the_daemon_drives_it() -> None:
    size, rounds = 256, 2
    cmd = [sys.executable, "-m", "arceusd.worker.speed_challenge"]
    proc = subprocess.Popen(
        [*cmd, "solve", str(size), str(rounds), "1", "cpu"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdin is not None
        assert _line(proc) == {"ready": True}
        seed = challenges.new_seed()
        proc.stdin.write(json.dumps({"seed": seed}) + "\n")
        proc.stdin.flush()
        root = bytes.fromhex(str(_line(proc)["root"]))
        opened = list(challenges.blocks_to_open(size, rounds, count=4))
        proc.stdin.write(json.dumps({"open": opened}) + "\n")
        proc.stdin.flush()
        shown = _line(proc)
        blocks = [bytes.fromhex(b) for b in shown["blocks"]]  # type: ignore[attr-defined]
        assert all(len(b) == challenges.BLOCK_ROWS * 4 for b in blocks)
        proofs = [[bytes.fromhex(h) for h in p] for p in shown["proofs"]]  # type: ignore[attr-defined]
        count = challenges.leaf_count(size, rounds)
        assert all(
            challenges.verify_proof(challenges.leaf_hash(b), i, count, p, root)
            for i, b, p in zip(opened, blocks, proofs, strict=True)
        )
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    request = {"size": size, "rounds": rounds, "seed": seed, "open": opened, "blocks": [b.hex() for b in blocks]}
    done = subprocess.run(
        [*cmd, "verify"],
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    )
    assert json.loads(done.stdout)["error"] < 1e-5
    # a shape out of bounds is refused with one line
    bad = subprocess.run([*cmd, "solve", "300", "1", "1", "cpu"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode != 0 and "challenge size 300" in bad.stderr
    # a device kind it does not know is refused with the usage line
    bad = subprocess.run([*cmd, "solve", "256", "1", "1", "tpu"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode != 0 and "KIND: cpu, cuda, mps" in bad.stderr


def test_a_challenge_is_solved_on_the_kind_this_device_lends_not_on_any_gpu_the_machine_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon with ``devices = ["cpu"]`` on a GPU machine lends its CPU: its challenge must time the CPU (it ran
    on the GPU whenever torch saw one)."""
    import torch

    from arceusd.worker import speed_challenge

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert speed_challenge._device("cpu") == torch.device("cpu")
    assert speed_challenge._device("cuda") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert speed_challenge._device("cuda") == torch.device("cpu")  # an offer names only kinds its probe found


def test_a_member_refuses_a_request_out_of_bounds_with_one_line() -> None:
    good = "ab" * 16
    assert challenges.check_request(good, 512, 10, 10.0) is None
    refusals = {
        "size": challenges.check_request(good, 8192, 10, 10.0),
        "rounds": challenges.check_request(good, 512, challenges.MAX_ROUNDS + 1, 10.0),
        "id": challenges.check_request("../" + good[3:], 512, 10, 10.0),
        "short id": challenges.check_request(good[:-1], 512, 10, 10.0),
        "nan wait": challenges.check_request(good, 512, 10, float("nan")),
        "long wait": challenges.check_request(good, 512, 10, challenges.MAX_WAIT_S * 2),
        "no wait": challenges.check_request(good, 512, 10, 0.0),
    }
    assert all(why and "\n" not in why for why in refusals.values()), refusals
    assert challenges.check_seed("0f" * 32) is None
    assert challenges.check_seed("0F" * 32) and challenges.check_seed("0f" * 31) and challenges.check_seed("zz" * 32)
