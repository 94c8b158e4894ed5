"""The peer network above the transport: finding peers, the membership's driver, bounds on what strangers say.

``arceusd/transport/`` (the authenticated streams, grpcio <-> trio) and ``arceusd/membership/`` (the pure SWIM
core) are its neighbours in the same layer; ``arceusd/daemon/network_service.py`` binds the three into the
daemon's peer network service.

- ``discovery.py``        zeroconf <-> trio (the only module importing zeroconf); an mDNS hint is never trusted
                          until a signed handshake proves the key
- ``peers.py``            the membership core's driver over the transport; routes the other peer messages
- ``announce_guard.py``   bounds on what strangers announce
"""
