"""arceusd: the Arceus daemon, its stage workers and its command line.

One identical daemon per device. The control plane (discovery, membership, election, jobs, planning, the local
control API) runs in one trio process; torch work runs in supervised stage-worker child processes.
"""

__version__ = "0.1.0"
