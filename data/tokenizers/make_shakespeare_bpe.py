"""Reproduce ``data/tokenizers/shakespeare-bpe.json``: a byte-level BPE tokenizer trained on Tiny Shakespeare.

Run from the repository root: ``.venv/bin/python data/tokenizers/make_shakespeare_bpe.py`` (offline; the
``tokenizers`` library only). Byte-level (GPT-2 style) pre-tokenisation, so any UTF-8 text encodes with no
unknown token; 2048 tokens including the one special token ``<|endoftext|>`` (id 0), which Arceus puts between
the documents of a JSONL data set. Training is deterministic: the same input gives the same file, whose sha256
``data/README.md`` lists.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "data" / "tinyshakespeare" / "input.txt"
TARGET = ROOT / "data" / "tokenizers" / "shakespeare-bpe.json"
VOCAB_SIZE = 2048
EOS = "<|endoftext|>"


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train([str(SOURCE)], trainer)
    return tok


def main() -> int:
    tok = build()
    TARGET.write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}: {tok.get_vocab_size()} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
