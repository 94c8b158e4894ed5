"""Jobs in the daemon. Import submodules directly.

A job's life, and the module of each step (the job core, ``core``, decides every transition; the manager's
parts carry out its actions; ``driver`` runs them)::

    submit        control_methods.m_submit     the owner parses the spec (spec), makes a JobCore (core)
      |
    announce      joining.announce             the owner tells every live peer (core: Announce)
      |
    join          joining.on_join_request      the leader checks the offer and the job's needs (claims, market)
      |                                        -> core: MemberJoined; enough members -> Plan
    plan          starting.plan                planning.make_job_plan over measured offers and links
      |                                        -> core: PlanFound / NoPlanFits (waiting, or paused)
    start         starting.start               resume slices (filework), JobStart to every member, which
      |           local_worker.on_start        verifies the plan itself, fetches its place's initial weights
      |                                        (initial_weights, transfers) and starts its worker (supervisor)
      |                                        -> core: StartAnswered -> SendGo
    go            starting.go_round            JobGo in plan order -> core: GoAnswered (running, or sent again)
      |           local_worker.on_go
    step          local_worker._follow_worker  the worker's events: progress, and reports to the leader (reports);
      |           speed_checks.on_step         a job running slow: the leader times each device (challenges)
    checkpoint    local_worker._when_complete  every device reported (shard_checks, witnesses, claims)
      |           commits.commit               -> core: CheckpointComplete -> Commit -> CommitDone / CommitFailed
      |           standby_sync                 the standby's copy after each commit (core: SyncStandby)
    export        driver.export                the final checkpoint -> the model (filework) -> core: ExportDone
      |
    done          driver (Finish)              members stopped, the election left (core: StopWorkers, Untrack)

Failures and leaders: a member dead, a worker failed, a report refused -> core: RestartAsked / MemberDead /
WorkerFailed -> recovering (a new term, CheckReachable, plan again from the last commit; paused when no plan
fits); with data-parallel replicas a lost device drops only its replica (core: DropReplica -> replica_drop, once
per checkpoint interval; the leader's own replica too, its worker then serving the data only) and the others
train on, then spares rebuild it
from the checkpoint the others hold at (core: HoldAt, Regrow -> regrow -> Regrown); a member that refuses
two starts in a row is excluded (core: Exclude), as is one whose worker fails a plan first, or whose shard
serving fails a commit (``CommitFailed.culprit``) or a DiLoCo witness dispute (``ShardWithheld``), twice in a row; the leader dead -> the elected standby takes over
(manager.take_over -> core: TakeoverReady); an owner whose members follow another leader hands the job over
(joining.hand_over -> core: HandOverAnswered).

What each module owns:

- the job spec: ``spec`` (the schema and the entry points), ``spec_parser`` (every field read and bounded),
  ``spec_identity`` (canonical form, hash, job id), ``spec_types`` (its parsed form), ``fields`` (field
  checks) and ``datafacts`` (what it needs to know of its data files); ``source``
  (the batches the owner serves from that data);
- the lifecycle: ``core`` (the pure state machine: states, roles and the ``(term, epoch)`` stamp; events in,
  actions out), ``lifecycle`` (its pure decisions on a failed commit, an unacknowledged ``go``, an ended
  election) and ``leadership`` (who may command);
- one job's record and its views: ``job`` (the ``Job`` record around its core, built by its three named
  constructors ``Job.submitted`` / ``Job.restored`` / ``Job.announced``, and ``arceusd status`` JSON),
  ``leader_record`` (what only its leader keeps, one small record per concern: its loop, the commits, the report
  checks, the speed checks, probation), ``job_paths`` (every file of a job's folder, named once),
  ``view`` (the text);
- the daemon's job service, a thin driver of the core: ``manager`` (the service, the leader's loop, member and
  leader changes, the takeover), ``driver`` (feeds the core and carries out its actions), a
  ``manager_base.JobContext`` (shared state, this device's offer, whom it follows as leader) that composes the
  parts, each handed the context and the ``manager_base.Lifecycle`` it calls back into: ``control_methods``
  (the control socket's job commands), ``local_worker`` (this device's stage worker and the workers' reports),
  ``standby_sync`` (the standby's and the owner's copies), ``commits`` (checkpoint commits), ``joining``
  (announcements, joins, the hand-over), ``starting`` (plan, start and ``go``), ``replica_drop`` and ``regrow``
  (a replica dropped and rebuilt, on the leader and the members); ``transfers`` (files between daemons);
- pure or file-level helpers: ``planning`` (offers, plan inputs, plan verification; every job planned as
  data-parallel replicas of a pipeline, one replica by default), ``recovery`` and ``reslice`` (checkpoints cut for
  a new plan), ``initial_weights`` (a stock LM's initial weights: the whole file on the owner and the standby,
  each other member's place's tensors), ``standby`` (the standby's files), ``export`` (the final model),
  ``probe`` (measuring this device in a child process), ``supervisor`` (the worker child process), ``filework``
  (re-slicing and export in a child process: the daemon never imports torch);
- what other devices say, checked before use: ``reports`` (a worker's event as the typed ``JobReport`` the leader
  takes, made once on the worker's device), ``claims`` (offers in physical bounds; each member's step times as
  it reported them and as the devices it works with saw them; discounts), ``challenges`` and ``speed_checks``
  (each device's speed timed by the leader: matrix products answered with a Merkle root, spot-checked; the
  products in a child process, ``arceusd.worker.speed_challenge``), ``probation`` (two neighbours that each say
  they waited on the other: one planned alone beside the leader), ``shard_checks`` and ``shard_scan``
  (checkpoint reports and shards: names from the plan, sizes bounded, finite values, expected shapes),
  ``plausibility`` (how far the optimizer can move a value between checkpoints: a shard past it is refused),
  ``witnesses`` (data-parallel replicas: each replica's digest of what all hold alike, compared at each commit),
  ``witness_shards`` (a DiLoCo dispute: the first replica's shard copied and its outer state read by the leader).
"""
