"""Stage worker: schedules, the stage engine, optimizers, tensor parallelism. Transport-agnostic.

The worker process wires ``StageEngine`` to the real transport through the ``Links`` interface
(``arceusd/worker/links.py``) and to tensor-parallel peers through ``Collective`` (``collective.py``).
"""
