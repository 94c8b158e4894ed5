"""What the leader's and the member's parts share: the shapes of their ports, the context the manager is, the
files they move, and the replica changes both apply. Imports nothing of ``leader``, ``member`` or ``service``.

- :mod:`~arceusd.jobs.common.manager_base`: :class:`JobContext` (the node, the peers, the jobs by id, this device's
  offer, whom it follows as a job's leader), which the manager is; the parts are not handed it;
- :mod:`~arceusd.jobs.common.ports`: the shapes of what the parts' ports hold (feed the core, ask for a restart,
  spawn, check a leader's command, take a report, ...); each part's port is a frozen dataclass beside the part;
- :mod:`~arceusd.jobs.common.transfers`: files between daemons, both sides: checkpoint shards, resume slices, the
  data set and initial weights, served and fetched in chunks;
- :mod:`~arceusd.jobs.common.replica_change`: a replica drop or rebuild applied on this device, its plan and its
  worker (the leader for itself, a member on the leader's command).
"""
