"""The member's side of a job: this device's stage worker and what it reports. Same layer as
:mod:`arceusd.jobs.leader`, and imports nothing of it (what it calls there is in
:class:`~arceusd.jobs.member.local_worker.LocalWorkerPorts`); below the service.

- :mod:`~arceusd.jobs.member.local_worker`: this device's stage worker started on the leader's command, let go,
  followed, its events reported (the leader takes them in :mod:`arceusd.jobs.leader.report_intake`);
- :mod:`~arceusd.jobs.member.reports`: a worker's event as the typed ``JobReport`` the leader takes, made once on
  the worker's device.
"""
