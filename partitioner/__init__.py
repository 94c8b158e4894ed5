"""Pure planning: model cost description + device profiles + link matrix -> Plan.

No torch modules, no sockets, no clocks, no hidden randomness: the same inputs give the same plan bytes, so every
member can recompute and verify the leader's plan. See ``ARCHITECTURE.md`` ("Planning").
"""
