"""Stock ``transformers`` causal-LM architectures (gpt2, llama, qwen2, mistral) as Arceus placeable blocks.

Owns nothing itself; the modules are: ``config`` (the bounded, canonical config; torch-free), ``keys`` (the
architecture's own tensor names and shapes per block; torch-free), ``costs`` (block costs for the partitioner;
torch-free), ``weights_check`` (initial weights checked from the file's header; torch-free), ``blocks`` (the
modules, built from the installed library's classes; workers only), ``weights`` (initial weights read lazily per
block; workers only), ``export`` (a ``from_pretrained``-loadable folder) and ``tokenizer_files`` (what
``AutoTokenizer`` needs beside a tokenizer.json; torch-free).
Importing this package imports neither torch nor transformers.
"""
