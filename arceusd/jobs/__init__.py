"""Jobs in the daemon, in rooms by who runs what. Import submodules directly.

The subpackages, lowest first; each may import those above it in this list, never one below
(``tests/unit/test_layers.py`` holds the code to it; the picture is in docs/ARCHITECTURE.md, "The layers")::

    spec/      the job spec: schema, parser, parsed types, identity (hash, job id), hf and lora parts   pure
    judging/   what other devices say, checked: claims, speed challenges, plausibility, shard scans     pure
    core/      the job's state machine (events in, actions out) and the leader's pure decisions          pure
               (lifecycle, leadership)
    plans/     plans and the files they name: planning, memory fit, job paths, recovery slices,         torch-free
               initial weights, the standby's files
    procs/     the torch child processes and the daemon's side of them: fork server, warm starts,
               the stage worker's supervisor, filework (re-slice, export), probe, the batch source
    record/    one job as this daemon knows it (Job; what its leader keeps: leader_record), known jobs,
               throughput, views
    common/    what the leader's and the member's parts share: the context (manager_base), transfers
    leader/    the leader's (and owner's) side: joining, starting, commits, shard checks, witnesses (and
    member/    witness shards), probation, speed checks, standby sync, replica drop, regrow; the member's side: its
               local worker and reports (leader/ and member/ are one layer: they import each other)
    service/   the composition: the manager, the driver of the core's actions, the control-socket
               methods, lending

A job's life, and the module of each step (the job core, ``core``, decides every transition; the manager's
parts carry out its actions; ``service.driver`` runs them)::

    submit        service.control_methods.m_submit   the owner parses the spec (spec), makes a JobCore (core)
      |
    announce      leader.joining.announce            the owner tells every live peer (core: Announce)
      |
    join          leader.joining.on_join_request     the leader checks the offer and the job's needs (judging.claims,
      |                                              market) -> core: MemberJoined; enough members -> Plan
    plan          leader.starting.plan               plans.planning.make_job_plan over measured offers and links
      |                                              -> core: PlanFound / NoPlanFits (waiting, or paused)
    start         leader.starting.start              resume slices (procs.filework), JobStart to every member,
      |           member.local_worker.on_start       which verifies the plan itself, fetches its place's initial
      |                                              weights (plans.initial_weights, common.transfers) and starts
      |                                              its worker (procs.supervisor) -> core: StartAnswered -> SendGo
    go            leader.starting.go_round           JobGo in plan order -> core: GoAnswered (running, or sent again)
      |           member.local_worker.on_go
    step          member.local_worker._follow_worker  the worker's events: progress, and reports to the leader
      |           leader.speed_checks.on_step        (member.reports); a job running slow: the leader times each
      |                                              device (judging.challenges)
    checkpoint    member.local_worker._when_complete  every device reported (leader.shard_checks, leader.witnesses,
      |           leader.commits.commit              judging.claims) -> core: CheckpointComplete -> Commit ->
      |           leader.standby_sync                CommitDone / CommitFailed; the standby's copy after each commit
    export        service.driver                     the final checkpoint -> the model (procs.filework) -> core:
      |                                              ExportDone
    done          service.driver (Finish)            members stopped, the election left (core: StopWorkers, Untrack)

Failures and leaders: a member dead, a worker failed, a report refused -> core: RestartAsked / MemberDead /
WorkerFailed -> recovering (a new term, CheckReachable, plan again from the last commit; paused when no plan
fits); with data-parallel replicas a lost device drops only its replica (core: DropReplica -> leader.replica_drop,
once per checkpoint interval) and the others train on, then spares rebuild it from the checkpoint the others hold at
(core: HoldAt, Regrow -> leader.regrow -> Regrown); a member that refuses two starts in a row is excluded (core:
Exclude), as is one whose worker fails a plan first, or whose shard serving fails a commit
(``CommitFailed.culprit``) or a DiLoCo witness dispute (``ShardWithheld``), twice in a row; the leader dead -> the
elected standby takes over (service.manager.take_over -> core: TakeoverReady); an owner whose members follow another
leader hands the job over (leader.joining.hand_over -> core: HandOverAnswered).
"""
