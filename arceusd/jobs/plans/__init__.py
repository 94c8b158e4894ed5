"""Plans and the files they name on this device: pure or file-level, torch-free. Imports only the spec, the judging
and the core of ``arceusd.jobs``.

- :mod:`~arceusd.jobs.plans.planning`: from a spec and the members' offers to a verified plan (every job planned as
  data-parallel replicas of a pipeline), and from a plan to the workers' stage list;
- :mod:`~arceusd.jobs.plans.memory_fit`: a job's training-state memory, and whether the devices seen can hold it;
- :mod:`~arceusd.jobs.plans.job_paths`: every file of a job's folder, named once;
- :mod:`~arceusd.jobs.plans.recovery`: a committed checkpoint cut into resume slices for a new plan (the cutting in
  a child process), and the resume description on the wire;
- :mod:`~arceusd.jobs.plans.initial_weights`: where a stock LM's initial weights are, and which part each device
  needs;
- :mod:`~arceusd.jobs.plans.standby`: the standby's files (what a standby needs to lead);
- :mod:`~arceusd.jobs.plans.grow_start`: what a spare's start in a dropped replica's place says (its slot, the
  slots, the shares, the ring generation).
"""
