"""Jobs in the daemon. Import submodules directly; what each owns:

- the job spec: ``spec`` (schema, validation, canonical form, hash, job id), ``spec_types`` (its parsed
  form), ``fields`` (field checks) and ``datafacts`` (what it needs to know of its data files); ``source``
  (the batches the owner serves from that data);
- one job's state and its views: ``job`` (the ``Job`` record and ``arceusd status`` JSON), ``view`` (the text);
- the daemon's job service: ``manager`` (lifecycle and leadership: plan, start, restart, take over, commit,
  export), a ``manager_base.JobContext`` (shared state, this device's offer, whom it follows as leader) that
  composes its parts, each handed the context and the ``manager_base.Lifecycle`` it calls back into:
  ``control_methods`` (the control socket's job commands), ``local_worker`` (this device's stage worker and the
  workers' reports), ``standby_sync`` (the standby's and the owner's copies), ``commits`` (checkpoint commits),
  ``joining`` (announcements and joins), ``starting`` (plan and start a plan epoch); ``transfers`` (files between
  daemons);
- pure or file-level helpers: ``planning`` (offers, plan inputs, plan verification; every job planned as data-parallel
  replicas of a pipeline, one replica by default), ``leadership`` (who may
  command), ``recovery`` and ``reslice`` (checkpoints cut for a new plan), ``standby`` (the standby's files),
  ``export`` (the final model), ``probe`` (measuring this device in a child process), ``supervisor`` (the
  worker child process), ``filework`` (re-slicing and export in a child process: the daemon never imports
  torch), ``lifecycle`` (the leader's pure decisions on a failed commit, an unacknowledged ``go``, an ended
  election);
- what other devices say, checked before use: ``claims`` (offers in physical bounds; each member's step times as
  it reported them and as the devices it works with saw them; discounts), ``shard_checks`` and ``shard_scan``
  (checkpoint reports and shards: names from the plan, sizes bounded, finite values, expected shapes),
  ``witnesses`` (data-parallel replicas: each replica's digest of what all hold alike, compared at each commit).
"""
