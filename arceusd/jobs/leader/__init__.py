"""The leader's side of a job (the owner's too, where it says so): the I/O of the core's actions and the judging of
what members report. Same layer as :mod:`arceusd.jobs.member`, and imports nothing of it (this device's own
worker is reached through :class:`~arceusd.jobs.leader.starting.StartingPorts`); below the service.

- :mod:`~arceusd.jobs.leader.joining`: the owner's announcements, the leader's answer to a join, the owner's
  hand-over to the leader its members follow (a device's own join: :mod:`arceusd.jobs.member.join`);
- :mod:`~arceusd.jobs.leader.starting`: plan, start and ``go`` (a plan epoch);
- :mod:`~arceusd.jobs.leader.report_intake`: members' reports taken (a failure or departure to the core; a
  checkpoint's shard and a witness checked and kept; the claims judged and the step committed once all reported);
- :mod:`~arceusd.jobs.leader.commits`: checkpoint commits, and repairing a damaged committed step;
- :mod:`~arceusd.jobs.leader.shard_checks`: a member's checkpoint report and shard checked; a failing member
  excluded;
- :mod:`~arceusd.jobs.leader.witnesses`: data-parallel replicas' witnesses compared at each checkpoint;
- :mod:`~arceusd.jobs.leader.witness_shards`: the first replica's shards read at a DiLoCo witness dispute;
- :mod:`~arceusd.jobs.leader.probation`: two neighbours that each say they waited on the other, settled by planning
  one alone beside the leader (pure, on the leader's :class:`ProbationBook`);
- :mod:`~arceusd.jobs.leader.speed_checks`: each device of the plan timed in a speed challenge, and judged;
- :mod:`~arceusd.jobs.leader.standby_sync`: the standby's copy sent after each commit, the owner's copy of the final
  checkpoint; the standby chosen;
- :mod:`~arceusd.jobs.leader.replica_drop`: a replica whose device is gone dropped, the devices left told;
- :mod:`~arceusd.jobs.leader.regrow`: a dropped replica rebuilt on spare members.

Every message here is one the leader sends or receives; what a member receives (``JobStart``, ``JobGo``,
``SpeedChallenge``, ``StandbySync``, ``JobDropReplica``, ...) is handled in :mod:`arceusd.jobs.member`
(``test_no_room_handles_a_message_the_other_side_receives`` in ``tests/unit/test_layers.py``).
"""
