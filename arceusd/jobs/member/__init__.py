"""The member's side of a job: every message a member receives from its leader (or a job's owner) is handled here.
Same layer as :mod:`arceusd.jobs.leader`, and imports nothing of it (what it calls there is in its port, e.g.
:class:`~arceusd.jobs.member.local_worker.LocalWorkerPorts`); below the service. What both sides apply alike (a
replica change) is in :mod:`arceusd.jobs.common`.

- :mod:`~arceusd.jobs.member.join`: an announcement taken, a join asked for by hand or automatically (the leader's
  answer: :mod:`arceusd.jobs.leader.joining`);
- :mod:`~arceusd.jobs.member.joins_in_flight`: the joins asked for and not yet settled (a start that overtakes the
  answer to one waits for it);
- :mod:`~arceusd.jobs.member.local_worker`: this device's stage worker started on the leader's command, let go,
  followed, its events reported (the leader takes them in :mod:`arceusd.jobs.leader.report_intake`);
- :mod:`~arceusd.jobs.member.reports`: a worker's event as the typed ``JobReport`` the leader takes, made once on
  the worker's device;
- :mod:`~arceusd.jobs.member.link_echo`: the echo of the leader's link measurement;
- :mod:`~arceusd.jobs.member.speed_answers`: this device's answers to a speed challenge (the leader's side:
  :mod:`arceusd.jobs.leader.speed_checks`);
- :mod:`~arceusd.jobs.member.standby_copy`: the standby's copy of each committed checkpoint, and a handed-over
  owner's copy of the final one (the leader sends them: :mod:`arceusd.jobs.leader.standby_sync`);
- :mod:`~arceusd.jobs.member.replica_changes`: the leader's replica drop and rebuild checked and taken in (the
  leader's side: :mod:`arceusd.jobs.leader.replica_drop`, :mod:`arceusd.jobs.leader.regrow`).
"""
