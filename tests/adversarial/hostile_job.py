"""A hostile job member: a real ``arceusd`` daemon in its own process (its own identity key, the real transport,
protocol and stage worker) whose job side lies, as an admitted member of a stranger's job can.

``python -m tests.adversarial.hostile_job`` takes the daemon's own command line; ``ARCEUS_HOSTILE`` names the lie
(``ARCEUS_HOSTILE_ARG`` its argument) and ``ARCEUS_HOSTILE_AFTER`` the checkpoint step from which it lies (0:
from the first). Attacks (issue #19 items 1, 3, 4 and 5):

* ``path``: checkpoint reports name the shard ``ARCEUS_HOSTILE_ARG`` (an absolute path outside the job), and the
  member serves its real shard under any name it is asked for;
* ``mismatch``: reports name another stage's shard (stage 0's, or stage 1's when it holds stage 0);
* ``huge``: reports claim a 16 GiB shard and serve a 16 GiB total of zeros for any shard asked for;
* ``nan``: the member overwrites every float32 tensor of its shard with NaN (a valid safetensors file, its
  sha256 and size reported truthfully), as a member that poisons the model would;
* ``finite``: as ``nan`` with the finite value ``ARCEUS_HOSTILE_ARG`` (1e30: finite poison, which passes a
  finite-value scan; issue #29 item 8);
* ``serve-big``: reports are true, but the member serves a 16 GiB total for its shard (issue #29 item 6);
* ``serve-slow``: reports are true, but the member answers each request for its shard after
  ``ARCEUS_HOSTILE_ARG`` seconds;
* ``checkpoint-error``: at each checkpoint the member reports its worker failed instead (issue #29 item 6);
* ``witness``: with replicas, the member's witnesses are made up (well-formed) digests (issue #29 item 6); it
  offers ``ARCEUS_HOSTILE_ARG`` times its speed (a few times: far below a discount) to be planned over a spare;
* ``witness-withhold``: as ``witness``, and the member serves a 16 GiB total for any shard asked for (in the
  first replica of a DiLoCo job, the shard the leader copies to settle the dispute: its word alone against the
  other replica's);
* ``bigmem``: the member offers 8 TiB of memory (within the physical bound; issue #29 item 7);
* ``claims``: the member offers 2^50 bytes of memory and 10^20 FLOP/s;
* ``overclaim``: the member offers ``ARCEUS_HOSTILE_ARG`` times its measured speed (within physical bounds), so
  the plan gives it more work than it can do in time;
* ``overclaim-hidden``: as ``overclaim``, and its checkpoint reports say its stage took what the plan predicted,
  the rest of its step spent waiting for the previous stage (its step times lie to cover its offer);
* ``refuse``: the member joins, then refuses every start of the job (it would spend the job's restarts);
* ``challenge-forge``: as ``overclaim-hidden``, and it answers the leader's speed challenges at once, with a made
  up root and made up blocks (well-formed, of the right sizes) instead of computing them;
* ``sandbag``: an honest offer, but its worker sleeps ``ARCEUSD_HOSTILE_ARG`` seconds before every step
  (``worker.step`` failpoint) and its reports say it spent them waiting on its neighbour (the previous stage's
  activations; the next stage's gradients on the first stage): it passes its speed challenges and slows the job
  on purpose, blaming its neighbour;
* ``challenge-abuse`` (run by the job's owner and leader, :data:`LEADER`): once the job runs, it sends each member
  speed challenges out of every bound, seeds and opens for challenges that do not exist, two challenges at once,
  and a challenge whose seed never comes; every answer is printed as ``hostile: answer <case> <ok> <reason>``.

:class:`HostileSwarm` is a :class:`arceusd.cli.swarm.LocalSwarm` whose daemon :data:`HOSTILE` runs this module.

Lies happen on the member's side only (its reports and serving); the daemon it attacks runs the real code.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from arceusd.cli.swarm import LocalSwarm  # noqa: E402

HUGE = 16 << 30
ATTACKS = (
    "none",
    "path",
    "mismatch",
    "huge",
    "nan",
    "finite",
    "serve-big",
    "serve-slow",
    "checkpoint-error",
    "witness",
    "witness-withhold",
    "bigmem",
    "claims",
    "overclaim",
    "overclaim-hidden",
    "refuse",
    "challenge-forge",
    "challenge-abuse",
    "sandbag",
)
"""``none``: an honest member (a baseline run through the same module)."""


def poison(path: Path, value: float = float("nan")) -> tuple[str, int]:
    """Overwrite every F32 tensor of the safetensors file at ``path`` with ``value`` (NaN by default); its new
    sha256 and size."""
    data = bytearray(path.read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    nan = struct.pack("<f", value)
    for key, entry in header.items():
        if key == "__metadata__" or entry.get("dtype") != "F32":
            continue
        begin, end = entry["data_offsets"]
        data[base + begin : base + end] = nan * ((end - begin) // 4)
    path.write_bytes(bytes(data))
    return hashlib.sha256(data).hexdigest(), len(data)


def install(attack: str, arg: str, after: int) -> None:
    from arceusd.jobs.common.transfers import Transfers, serve_chunk
    from arceusd.jobs.member.local_worker import LocalWorker
    from arceusd.jobs.service import manager as manager_module
    from protocol.job_wire import ShardData

    real_report = LocalWorker._report
    real_serve = Transfers.on_shard_request
    real_names: dict[int, str] = {}

    async def report(self: Any, job: Any, epoch: int, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if attack == "checkpoint-error" and kind == "checkpoint" and int(event["step"]) >= after:
            print(f"hostile: an error for checkpoint {event['step']}", file=sys.stderr, flush=True)
            event = {"event": "error", "message": "checkpoint failed: the disk is full"}
        if attack in ("witness", "witness-withhold") and kind == "witness" and int(event["step"]) >= after:
            print(f"hostile: a made-up witness for step {event['step']}", file=sys.stderr, flush=True)
            event = {**event, "digest": os.urandom(32).hex()}
        if event.get("event") == "checkpoint" and not self.ports.leads(job) and int(event["step"]) >= after:
            shard = dict(event["shard"])
            step = int(event["step"])
            real_names[step] = shard["name"]
            if attack == "path":
                shard["name"] = arg
            elif attack == "mismatch":
                own, first = shard["name"], "stage0-rank0.safetensors"
                shard["name"] = first if own != first else "stage1-rank0.safetensors"  # another stage's file
            elif attack == "huge":
                shard["size"] = HUGE
            elif attack in ("nan", "finite"):
                from arceusd.files.checkpoint import step_dir

                path = step_dir(job.paths.checkpoints, step) / shard["name"]
                shard["sha256"], shard["size"] = poison(path, float(arg) if attack == "finite" else float("nan"))
            event = {**event, "shard": shard}
            print(f"hostile: {attack} at step {step}", file=sys.stderr, flush=True)
        await real_report(self, job, epoch, event)

    async def serve(self: Any, header: Any, msg: Any) -> Any:
        if attack in ("huge", "serve-big", "witness-withhold") and msg.step >= after:
            return ShardData(HUGE, b"\0" * min(1 << 20, HUGE - msg.offset))
        if attack == "serve-slow" and msg.step >= after:
            import trio

            await trio.sleep(float(arg))
        if attack in ("path", "mismatch") and msg.step in real_names:
            from arceusd.files.checkpoint import step_dir

            job = self.jobs.get(msg.job_id)
            if job is not None:
                return serve_chunk(step_dir(job.paths.checkpoints, msg.step) / real_names[msg.step], msg.offset)
        return await real_serve(self, header, msg)

    if attack == "refuse":
        from protocol.job_wire import JobStartReply

        async def refuse(self: Any, header: Any, msg: Any) -> Any:
            print("hostile: refusing a start", file=sys.stderr, flush=True)
            return JobStartReply(msg.job_id, False, "start refused: not today")

        LocalWorker.on_start = refuse  # type: ignore[method-assign]
    LocalWorker._report = report  # type: ignore[method-assign]
    Transfers.on_shard_request = serve  # type: ignore[method-assign]
    if attack == "challenge-forge":
        forge_challenges()
    if attack == "challenge-abuse":
        abuse_challenges()
    if attack in ("overclaim-hidden", "challenge-forge"):
        from arceusd.jobs.judging import claims

        real_times = claims.own_step_times

        def hidden_times(job: Any, me: str) -> dict[str, float]:
            times = real_times(job, me)
            excess = times["step_s"] - times["predicted_s"] if times else 0.0
            if excess <= 0:
                return times
            print(
                f"hostile: reports {times['predicted_s']:.3f} s of its {times['step_s']:.3f} s",
                file=sys.stderr,
                flush=True,
            )
            return {
                **times,
                "step_s": times["predicted_s"],
                "wait_s": times["wait_s"] + excess,
                "wait_up_s": times["wait_up_s"] + excess,
            }

        claims.own_step_times = hidden_times
    if attack == "sandbag":
        from arceusd.jobs.judging import claims as claims_module

        honest_times = claims_module.own_step_times

        def blaming(job: Any, me: str) -> dict[str, float]:
            times = honest_times(job, me)
            if not times or job.plan is None:
                return times
            first = any(sh.peer_id == me for sh in job.plan.stages[0].shares)
            side = "wait_down_s" if first else "wait_up_s"
            print(f"hostile: blames {side} for its {arg} s naps", file=sys.stderr, flush=True)
            return {**times, "wait_s": times["wait_s"] + float(arg), side: times[side] + float(arg)}

        claims_module.own_step_times = blaming
    if attack in (
        "claims",
        "overclaim",
        "overclaim-hidden",
        "challenge-forge",
        "bigmem",
        "witness",
        "witness-withhold",
    ):
        real_offer = manager_module.JobManager.offer

        async def offer(self: Any) -> Any:
            honest = await real_offer(self)
            if attack == "bigmem":
                return replace(honest, memory_bytes=8 << 40)
            if attack in ("witness", "witness-withhold"):
                return replace(honest, flops_per_s=honest.flops_per_s * float(arg or 1))
            if attack != "claims":
                return replace(honest, flops_per_s=honest.flops_per_s * float(arg))
            return replace(honest, memory_bytes=1 << 50, flops_per_s=1e20)

        manager_module.JobManager.offer = offer  # type: ignore[method-assign]


def forge_challenges() -> None:
    """Answer speed challenges without computing: a random root, then random blocks with proofs of the right
    sizes (what a member that claims more speed than it has would try)."""
    from arceusd.jobs.judging import challenges
    from arceusd.jobs.member.speed_answers import SpeedAnswers
    from protocol.job_wire import ChallengeBlocks, ChallengeRoot, JobAck

    shapes: dict[str, tuple[int, int]] = {}

    async def on_challenge(self: Any, header: Any, msg: Any) -> Any:
        shapes[msg.challenge] = (msg.size, msg.rounds)
        return JobAck(True)

    async def on_go(self: Any, header: Any, msg: Any) -> Any:
        print("hostile: forging a challenge's root", file=sys.stderr, flush=True)
        return ChallengeRoot(msg.challenge, os.urandom(32).hex())

    async def on_open(self: Any, header: Any, msg: Any) -> Any:
        size, rounds = shapes.get(msg.challenge, (256, 1))
        depth = max(1, (challenges.leaf_count(size, rounds) - 1).bit_length())
        return ChallengeBlocks(
            msg.challenge,
            tuple(os.urandom(challenges.BLOCK_ROWS * 4) for _ in msg.leaves),
            tuple(os.urandom(32 * depth) for _ in msg.leaves),
        )

    SpeedAnswers.on_challenge = on_challenge  # type: ignore[method-assign]
    SpeedAnswers.on_go = on_go  # type: ignore[method-assign]
    SpeedAnswers.on_open = on_open  # type: ignore[method-assign]


ABUSES = (
    "size",
    "rounds",
    "long wait",
    "nan wait",
    "bad id",
    "go unknown",
    "open unknown",
    "first",
    "second",
    "bad seed after first",
    "go after ended",
    "pending",
)
"""What :func:`abuse_challenges` sends each member, in order (``first`` and ``pending``: well-formed)."""


def abuse_challenges() -> None:
    """The leader side of ``challenge-abuse``: instead of timing its members, abuse their challenge handlers."""
    import secrets

    from arceusd.jobs.leader.speed_checks import SpeedChecks
    from protocol.job_wire import ChallengeGo, ChallengeOpen, SpeedChallenge

    started: set[str] = set()

    def on_step(self: Any, job: Any) -> None:
        if job.job_id in started or job.plan is None or not self.ports.leads(job) or len(job.stage_times) < 3:
            return
        started.add(job.job_id)
        self.ports.spawn(abuse, self, job)

    async def abuse(self: Any, job: Any) -> None:
        me = self.ports.me
        for peer in [p for p in job.plan_peers() if p != me and p in job.members]:
            await abuse_one(self, job, peer)

    async def abuse_one(self: Any, job: Any, peer: str) -> None:
        jid, first = job.job_id, secrets.token_hex(16)
        cases: list[tuple[str, Any]] = [
            ("size", SpeedChallenge(jid, secrets.token_hex(16), 8192, 1, 5.0)),
            ("rounds", SpeedChallenge(jid, secrets.token_hex(16), 512, 10**6, 5.0)),
            ("long wait", SpeedChallenge(jid, secrets.token_hex(16), 512, 2, 1e9)),
            ("nan wait", SpeedChallenge(jid, secrets.token_hex(16), 512, 2, float("nan"))),
            ("bad id", SpeedChallenge(jid, "../" * 10 + "xx", 512, 2, 5.0)),
            ("go unknown", ChallengeGo(jid, secrets.token_hex(16), "0f" * 32)),
            ("open unknown", ChallengeOpen(jid, secrets.token_hex(16), (0, 1, 2))),
            ("first", SpeedChallenge(jid, first, 256, 2, 5.0)),
            ("second", SpeedChallenge(jid, secrets.token_hex(16), 256, 2, 5.0)),
            ("bad seed after first", ChallengeGo(jid, first, "ZZ" * 32)),
            ("go after ended", ChallengeGo(jid, first, "0f" * 32)),
            ("pending", SpeedChallenge(jid, secrets.token_hex(16), 256, 2, 5.0)),  # its seed never comes
        ]
        assert tuple(c for c, _ in cases) == ABUSES
        kw = {"job_id": jid, "term": job.term, "epoch": job.epoch}
        for case, msg in cases:
            answer = await self.ports.peers.request(job.members[peer].address, peer, msg, 40.0, **kw)
            ok, reason = getattr(answer, "ok", type(answer).__name__), getattr(answer, "reason", "")
            print(f"hostile: answer {peer[:12]} {case}: {ok} {reason[:80]}", file=sys.stderr, flush=True)

    SpeedChecks.on_step = on_step  # type: ignore[method-assign]


HOSTILE = 2
"""The hostile daemon's index in a :class:`HostileSwarm`: a member (index 0 owns and leads the job)."""


LEADER = 0
"""The daemon that owns and leads the job (the hostile one for ``challenge-abuse``)."""


class HostileSwarm(LocalSwarm):
    """Three daemons (``size``) on loopback; daemon ``hostile``
    (:data:`HOSTILE`, a member, by default) runs this module with ``attack`` from checkpoint step ``after`` on."""

    def __init__(
        self,
        root: Path,
        attack: str,
        arg: str = "",
        after: int = 0,
        hostile: int = HOSTILE,
        preset: str = "local",
        size: int = 3,
    ) -> None:
        super().__init__(root, size, ["--auto-join"], preset=preset)
        self.hostile = hostile
        self.hostile_env = {
            **self.env,
            "ARCEUS_HOSTILE": attack,
            "ARCEUS_HOSTILE_ARG": arg,
            "ARCEUS_HOSTILE_AFTER": str(after),
        }
        if attack == "sandbag":  # its workers sleep before every step
            self.hostile_env["ARCEUSD_FAILPOINTS"] = f"worker.step=sleep:{arg}"

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        if i != self.hostile:
            return super()._spawn(i)
        cmd = self.daemon_command(i, "tests.adversarial.hostile_job")
        self.share_profile(i)  # its offers are then multiples of the honest daemons' (it measured itself, under load)
        state = self.state_dir(i)
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(state.parent / "hostile.stderr").open("ab"),
            env=self.hostile_env,
            cwd=ROOT,
        )


def main() -> None:
    attack = os.environ.get("ARCEUS_HOSTILE", "")
    if attack not in ATTACKS:
        sys.exit(f"ARCEUS_HOSTILE must be one of {ATTACKS}, got {attack!r}")
    if attack != "none":
        install(attack, os.environ.get("ARCEUS_HOSTILE_ARG", ""), int(os.environ.get("ARCEUS_HOSTILE_AFTER", "0")))
    from arceusd.cli.commands import main as arceusd_main

    sys.argv = ["arceusd", *sys.argv[1:]]
    arceusd_main()


if __name__ == "__main__":
    main()
