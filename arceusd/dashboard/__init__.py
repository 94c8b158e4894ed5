"""The web dashboard: a live view of the swarm, its jobs, the device owner's contributions and the market.

``arceusd dashboard`` asks the local daemon (control method ``dashboard``) for the URL; the daemon starts the web
server on first request, inside its own trio nursery (hypercorn on trio, a starlette app), on
``dashboard_host:dashboard_port`` (127.0.0.1 and any free port unless config.toml says otherwise), every path
behind a random per-run token. Every asset ships in this package (``static/``); nothing is fetched from another
host. Modules:

- :mod:`arceusd.dashboard.data`: the snapshot provider (the same JSON the control methods answer) and the
  pure views the pages draw (history downsampling, the validation timeline);
- :mod:`arceusd.dashboard.app`: the starlette app (token check, pages, JSON endpoints, server-sent events);
- :mod:`arceusd.dashboard.service`: the daemon side (the ``dashboard`` control method, the server's lifetime);
- :mod:`arceusd.dashboard.commands`: the ``arceusd dashboard`` command;
- :mod:`arceusd.dashboard.opener`: opening it in a browser through a 0600 page (the token on no command line);
- :mod:`arceusd.dashboard.watch`: ``arceusd status --watch``, a rich live view in the terminal.
"""
