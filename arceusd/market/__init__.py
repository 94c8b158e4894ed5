"""The marketplace: what a device-hour costs, when a device lends, which jobs it qualifies for, and the
signed record of who worked for whom.

Modules, one concern each:
- ``pricing``: price per device-hour from measured FLOP/s and demand; the cloud price table and comparison.
- ``policy``: the device owner's terms (``[policy]`` in config.toml) and their pure evaluation.
- ``probes``: what the machine says now (idle time, power, battery, the owner's CPU use), read from /proc,
  /sys, loginctl, pmset and ioreg output; a folder with the same files stands in for the machine in tests.
- ``needs``: what a job asks of its devices (the spec's ``[needs]``) and the pure match against an offer.
- ``quote``: the estimate for a job (time, cost, the cloud's cost for the same FLOPs; what of the budget and
  deadline it cannot meet).
- ``admission``: the leader's side of the needs: whom it admits, when the members hold the total memory, when the
  budget stops a running job.
- ``receipts``: signed per-device receipts for committed work, bounded by the plan.
- ``paid_speed``: the speed a receipt pays a device for: what the leader measured of it, at most its offer.
- ``authority``: the job owner's signed word that a leader (its standby) may sign the job's receipts.
- ``ledger``: the append-only, hash-chained, keeper-signed file of receipts and authorisations in the state
  directory, with its signed head.
- ``unpaid``: a member's count of its checkpoints no receipt pays, and when it leaves the job for it.
- ``collect``: the job owner's copy of every receipt for its job (from its leaders and devices, checked).
"""
