"""The child processes that run torch, and the daemon's side that starts and talks to them (the daemon never
imports torch). Below the job's record: imports only spec, judging, core and plans of ``arceusd.jobs``.

- :mod:`~arceusd.jobs.procs.fork_server`: the child that imported torch once and forks the daemon's torch programs;
- :mod:`~arceusd.jobs.procs.warm_starts`: the daemon's side of it (:class:`WarmStarts`, :class:`ForkedProcess`);
- :mod:`~arceusd.jobs.procs.supervisor`: one stage-worker child process: start it, learn its port, send it commands,
  read its events;
- :mod:`~arceusd.jobs.procs.filework`: ``python -m arceusd.jobs.procs.filework``: re-slicing, export and plan shapes
  in a child process, and the daemon's calls into it;
- :mod:`~arceusd.jobs.procs.reslice`: re-slicing a committed checkpoint for a new plan (torch, in filework's child);
- :mod:`~arceusd.jobs.procs.export`: the finished model as ``model.safetensors`` (torch, in filework's child);
- :mod:`~arceusd.jobs.procs.probe`: ``python -m arceusd.jobs.procs.probe``: this device measured, its offer printed;
- :mod:`~arceusd.jobs.procs.challenge_child`: a speed challenge's solving child (both sides of a challenge run one);
- :mod:`~arceusd.jobs.procs.source`: a spec's batch source (torch, in the worker process).
"""
