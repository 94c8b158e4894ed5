"""The 11 M Llama example on two local daemons against a unigram model (issue 30, item 9), then its LoRA fine-tune.

Starts 2 local daemons (each stage worker on a core of its own where there are enough, as the demo), submits
``examples/llama-shakespeare-11m.toml`` and follows it to ``done``; prints the wall time from submit to done and
the job's final validation loss beside the unigram model's cross-entropy on the same validation ids (the token
frequencies of the training split, add-one smoothed: what a model learns first). The goal: clearly below the
unigram's within 5 minutes. With ``--lora`` it then fine-tunes the export with
``examples/llama-shakespeare-11m-lora.toml`` (the base copied next to a copy of the spec) and prints the same for
it, and that ``transformers`` loads the merged model.

    python bench/example_llama.py [--lora]
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arceusd.cli.swarm import LocalSwarm
from arceusd.data.tokenized import load_tokens

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BASE = EXAMPLES / "llama-shakespeare-11m.toml"
LORA = EXAMPLES / "llama-shakespeare-11m-lora.toml"
BUDGET_S = 300.0


def unigram_nats(cache: Path) -> float:
    """Cross-entropy per validation token of the training split's add-one smoothed token frequencies."""
    data = load_tokens(
        ROOT / "data/tinyshakespeare/input.txt",
        ROOT / "data/tokenizers/shakespeare-bpe.json",
        val_fraction=0.1,
        cache_dir=cache,
    )
    counts, total = Counter(data.train.tolist()), int(data.train.numel())
    val = data.val.tolist()
    return -sum(math.log((counts[t] + 1) / (total + data.vocab_size)) for t in val) / len(val)


def run(swarm: LocalSwarm, spec: Path) -> tuple[float, dict[str, Any]]:
    """Submit ``spec`` on daemon 0 for both daemons; seconds from submit to the end, and the job's last view."""
    began = time.monotonic()
    job_id = swarm.call(0, "submit", {"spec_path": str(spec), "min_members": 2}, timeout=300)["job_id"]
    deadline = began + 3600
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = swarm.call(0, "job", {"job_id": job_id}, timeout=30)
        if view["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(1.0)
    return time.monotonic() - began, view


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lora", action="store_true", help="then fine-tune the export with LoRA")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arceus-example-llama-") as tmp:
        unigram = unigram_nats(Path(tmp) / "tokens")
        swarm = LocalSwarm(Path(tmp) / "swarm", 2, ["--auto-join"], preset="lan", pin_workers=True)
        try:
            swarm.start()
            swarm.wait_converged(60)
            seconds, view = run(swarm, BASE)
            devices = sorted(
                {d["peer_id"][:8] for st in (view.get("plan") or {}).get("stages", []) for d in st["devices"]}
            )
            print(
                f"base  {view['state']} in {seconds:.0f} s (budget {BUDGET_S:.0f} s) on {len(devices)} device(s): "
                f"validation loss {view.get('val_loss')} nats/token, unigram {unigram:.3f} "
                f"({(view.get('val_loss') or math.nan) - unigram:+.3f}); {view.get('tokens_per_s')} tokens/s",
                flush=True,
            )
            if view["state"] != "done" or not args.lora:
                return
            folder = Path(tmp) / "lora"
            folder.mkdir()
            shutil.copyfile(
                Path(str(view["model_path"])).parent / "model.safetensors",
                folder / "llama-shakespeare-11m-base.safetensors",
            )
            text = LORA.read_text().replace('"../data/', f'"{ROOT / "data"}/')
            text = text.replace('config = "llama-11m.config.json"', f'config = "{EXAMPLES / "llama-11m.config.json"}"')
            spec = folder / LORA.name
            spec.write_text(text)
            seconds, tuned = run(swarm, spec)
            print(
                f"lora  {tuned['state']} in {seconds:.0f} s: validation loss {tuned.get('val_loss')} "
                f"(base {view.get('val_loss')})",
                flush=True,
            )
            if tuned["state"] == "done":
                from transformers import AutoModelForCausalLM

                merged = Path(str(tuned["model_path"])).parent / "merged"
                model = AutoModelForCausalLM.from_pretrained(merged)
                print(f"lora  transformers loads {merged}: {sum(p.numel() for p in model.parameters()):,} parameters")
        finally:
            swarm.close()


if __name__ == "__main__":
    main()
