"""Jobs in the daemon, in rooms by who runs what. Import submodules directly.

The subpackages, lowest first: each may import the ones listed before it, never one listed after
(``JOB_LAYERS`` in ``tests/unit/test_layers.py`` holds the code to it; the picture is in docs/ARCHITECTURE.md,
"The layers")::

    spec/      the job spec: schema, parser, parsed types, identity (hash, job id), hf and lora parts   pure
    judging/   what other devices say, checked: claims, speed challenges, plausibility, shard scans     pure
    core/      the job's state machine (events in, actions out) and the leader's pure decisions          pure
               (lifecycle, leadership)
    plans/     plans and the files they name: planning, memory fit, job paths, recovery slices,         torch-free
               initial weights, the standby's files
    procs/     the torch child processes and the daemon's side of them: fork server, warm starts,
               the stage worker's supervisor, filework (re-slice, export), probe, the batch source,
               the speed challenge's child
    record/    one job as this daemon knows it (Job; what its leader keeps: leader_record), known jobs,
               throughput, views (the report figures status shows: report_fields)
    common/    what the leader's and the member's parts share: the shapes of their ports (ports), the
               context the manager is (manager_base), transfers, a replica change applied (replica_change)
    leader/    the leader's (and owner's) side: joining, starting, report intake, commits, shard checks,
               witnesses, witness shards, probation, speed checks, standby sync, replica drop, regrow
    member/    the member's side, every message a member receives: join, local worker and reports, link
               echo, speed answers, standby copy, replica changes (one layer with leader/; neither imports
               the other: each calls the other through its port)
    service/   the composition: the manager, the driver of the core's actions, the control-socket
               methods, lending

A job's life from submit to done, the module and function of each step, and what happens on failures and when
leaders change: docs/ARCHITECTURE.md, "A job's life" (the one map of the flow; docstrings here point to it).
"""
