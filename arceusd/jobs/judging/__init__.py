"""Pure checks of what other devices say about themselves or the job, before this daemon acts on it. No I/O but
reading a file it is handed; imports only :mod:`arceusd.jobs.spec` of ``arceusd.jobs``.

- :mod:`~arceusd.jobs.judging.claims`: offers within physical bounds, step times as reported and as neighbours saw
  them, the discounts;
- :mod:`~arceusd.jobs.judging.challenges`: leader-timed speed challenges (matrix products, a Merkle root, spot
  checks) and what an offered speed is worth;
- :mod:`~arceusd.jobs.judging.plausibility`: how far training can move a parameter between checkpoints;
- :mod:`~arceusd.jobs.judging.shard_scan`: a checkpoint shard's safetensors header and values, checked without torch.
"""
