"""Per-job leader elections (Raft-style terms), in the network layer.

- ``core.py``     the pure election state machine: events in, actions out, no I/O
- ``driver.py``   its trio driver: votes and leader announcements over the peer network, terms kept on disk
"""
