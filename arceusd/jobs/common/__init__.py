"""What the leader's and the member's parts share: the context they are handed and the files they move. Imports
nothing of ``leader``, ``member`` or ``service``.

- :mod:`~arceusd.jobs.common.manager_base`: :class:`JobContext` (the node, the peers, the jobs by id, this device's
  offer, whom it follows as a job's leader) and :class:`Lifecycle` (what the parts call back into);
- :mod:`~arceusd.jobs.common.transfers`: files between daemons, both sides: checkpoint shards, resume slices, the
  data set and initial weights, served and fetched in chunks.
"""
