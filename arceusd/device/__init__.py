"""This device as its services see it: its configuration, the node they share, its measured profile.

- ``config.py``    ``config.toml`` and the presets (``lan``, ``local``), merged with ``arceusd start``'s flags
- ``node.py``      ``Node``: what every service of one daemon shares (identity, config, status sections,
                   control methods) and the ports they reach each other by (``JobService``)
- ``profile.py``   measuring this device (in a child process), for the planner
- ``link_probe.py`` measuring a link to a peer over an echo (round trip, bandwidth, cost per message)
"""
