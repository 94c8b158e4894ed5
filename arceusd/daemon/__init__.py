"""The daemon process itself: its start, its peer network service, and its install as a service.

- ``run.py``               opens every service in one trio nursery; signals; nothing else
                           (``python -m arceusd start --foreground`` ends here)
- ``network_service.py``   the peer network service: transport + membership + discovery + elections, bound
                           into the ``Node``
- ``service.py``           the systemd user unit / launchd agent (templates in ``systemd/`` and ``launchd/``)
"""
