"""Stage worker: schedules, the stage engine, optimizers, tensor parallelism. Transport-agnostic.

The worker process wires ``StageEngine`` to the real transport through the ``Links`` interface
(``arceusd/worker/links.py``) and to tensor-parallel peers through ``Collective`` (``collective.py``). Data-parallel
replicas of a pipeline keep each stage in step with the same stage of the other replicas through ``ReplicaSync``
(``replicas.py``: all-reduce every step, or DiLoCo) over a ``RingLink`` (``ring.py``; in memory only so far).
"""
