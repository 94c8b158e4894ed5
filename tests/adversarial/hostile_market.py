"""A hostile job owner in the marketplace: a real ``arceusd`` daemon in its own process (its own key, the real
transport, protocol, job code and stage worker) whose market side cheats the members it leads (issue 29).

``python -m tests.adversarial.hostile_market`` takes the daemon's own command line; ``ARCEUS_HOSTILE`` names the
cheat:

* ``none``: an honest owner (the baseline, through the same module);
* ``withhold``: the owner leads and trains the job but never sends a receipt to a member (it keeps its own);
* ``zero``: the owner sends every receipt priced at $0/h;
* ``split``: both at once, in one job: the owner withholds the receipts of the members whose peer ids the file
  ``ARCEUS_HOSTILE_ARG`` lists (one a line, read at each commit: the test writes it once it knows them) and sends
  every other member's priced at $0/h.

``ARCEUS_HOSTILE_NAP`` (seconds, optional) makes its stage workers sleep before every step (``worker.step``
failpoint), so the job's checkpoints come seconds apart, as a real model's do.

:class:`MarketSwarm` is a :class:`arceusd.cli.swarm.LocalSwarm` whose daemon 0 (the job's owner and leader) runs this
module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from arceusd.cli.swarm import LocalSwarm  # noqa: E402

ATTACKS = ("none", "withhold", "zero", "split")
OWNER = 0


def withheld(attack: str) -> frozenset[str] | None:
    """The members whose receipts the owner withholds (None: every member's)."""
    if attack != "split":
        return None
    path = Path(os.environ.get("ARCEUS_HOSTILE_ARG", ""))
    return frozenset(path.read_text().split()) if path.is_file() else frozenset()


def install(attack: str) -> None:
    from dataclasses import replace

    from arceusd.market import service
    from arceusd.market.receipts import countersign

    if attack in ("withhold", "split"):
        real_settle = service.Market._settle

        async def settle(
            self: Any, job: Any, signed: list[Any], addresses: dict[str, str], authority: bytes = b""
        ) -> None:
            me, victims = self.node.identity.peer_id, withheld(attack)
            if victims is not None:  # split: the other members' ($0) receipts go out as an honest owner's do
                await real_settle(
                    self, job, [s for s in signed if s.receipt.device not in victims], addresses, authority
                )
            for s in signed:
                if victims is not None and s.receipt.device not in victims:
                    continue
                if s.receipt.device == me:
                    self._append(countersign(self.node.identity, s))
                else:
                    print(
                        f"hostile: withholding the receipt of {s.receipt.device[:12]} for steps "
                        f"{s.receipt.step_from}..{s.receipt.step_to}",
                        file=sys.stderr,
                        flush=True,
                    )

        service.Market._settle = settle  # type: ignore[method-assign]
    if attack == "zero":

        def pay(*_args: Any, **_kw: Any) -> float:
            return 0.0

        service.pay = pay  # type: ignore[attr-defined]  # the name the market service prices receipts with
        print("hostile: every receipt priced at $0", file=sys.stderr, flush=True)
    if attack == "split":
        real_commit = service.Market._commit

        def commit(self: Any, *args: Any, **kw: Any) -> Any:
            c = real_commit(self, *args, **kw)
            victims = withheld(attack) or frozenset()
            return replace(c, prices={peer: p if peer in victims else 0.0 for peer, p in c.prices.items()})

        service.Market._commit = commit  # type: ignore[method-assign]
        print(
            "hostile: the listed members' receipts withheld, every other one priced at $0", file=sys.stderr, flush=True
        )


class MarketSwarm(LocalSwarm):
    """``size`` daemons on loopback; daemon ``hostile`` (default :data:`OWNER`) runs ``module`` (default this one)
    with ``attack`` (and ``arg``, from the first checkpoint), its workers napping ``nap`` seconds before each step.
    ``module="tests.adversarial.hostile_job"`` runs that module's member attacks instead."""

    def __init__(
        self,
        root: Path,
        attack: str,
        nap: float = 0.0,
        size: int = 3,
        hostile: int = OWNER,
        module: str = "tests.adversarial.hostile_market",
        arg: str = "",
    ) -> None:
        super().__init__(root, size, ["--auto-join"], preset="local")
        self.hostile, self.module = hostile, module
        self.hostile_env = {
            **self.env,
            "ARCEUS_HOSTILE": attack,
            "ARCEUS_HOSTILE_ARG": arg,
            "ARCEUS_HOSTILE_AFTER": "0",
        }
        if nap:
            self.hostile_env["ARCEUSD_FAILPOINTS"] = f"worker.step=sleep:{nap}"

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        if i != self.hostile:
            return super()._spawn(i)
        cmd = self.daemon_command(i, self.module)
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
        install(attack)
    from arceusd.cli.commands import main as arceusd_main

    sys.argv = ["arceusd", *sys.argv[1:]]
    arceusd_main()


if __name__ == "__main__":
    main()
