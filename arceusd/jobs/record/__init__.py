"""One job as this daemon knows it, and what it shows users. Imports spec, judging, core, plans and procs of
``arceusd.jobs``, nothing of the leader's, the member's or the service's side.

- :mod:`~arceusd.jobs.record.job`: :class:`Job` around its core (built by ``Job.submitted`` / ``Job.restored`` /
  ``Job.announced``) and the ``arceusd status`` JSON (``Job.summary``);
- :mod:`~arceusd.jobs.record.leader_record`: what only its leader keeps (``job.leading``), one small record per
  concern: its loop, the commits, the report checks, the speed checks, probation;
- :mod:`~arceusd.jobs.record.known`: jobs a restarted daemon knows only from its own files (``arceusd jobs``);
- :mod:`~arceusd.jobs.record.throughput`: steps/s, samples/s, tokens/s and the time left, from the step counter;
- :mod:`~arceusd.jobs.record.view`: the text of ``arceusd jobs`` and ``arceusd status JOB``;
- :mod:`~arceusd.jobs.record.report_fields`: the one table of members' report figures that ``status JOB`` shows
  (its JSON and its text both read it).
"""
