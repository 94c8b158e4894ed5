"""The daemon's job service: the composition root that builds the parts and the driver that runs the core's
actions. The top of ``arceusd.jobs``: nothing else in it imports this package.

- :mod:`~arceusd.jobs.service.manager`: :class:`JobManager`, the service (the leader's loop, member and leader
  changes, the takeover), which builds every part and registers their handlers;
- :mod:`~arceusd.jobs.service.driver`: :class:`Driver`, which feeds a job's core the events the daemon sees and
  carries out the actions it returns;
- :mod:`~arceusd.jobs.service.control_methods`: the control socket's job commands (``submit``, ``join``, ``jobs``,
  ``job``, ``cancel``, ``leave``, ``lending``);
- :mod:`~arceusd.jobs.service.lending`: what the devices this daemon sees lend, asked at ``submit``.
"""
