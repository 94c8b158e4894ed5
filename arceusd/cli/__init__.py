"""The ``arceusd`` command line (the top layer): it talks to the daemon over the control socket.

- ``commands.py``   the click group and its commands; ``main`` is the console script (``arceusd.cli:main``,
                    also ``python -m arceusd``). ``market/commands.py`` and ``dashboard/commands.py`` register
                    theirs on it
- ``context.py``    the commands' context object: the state directory and the call to its daemon
- ``swarm.py``      a local swarm of daemons as processes on loopback (the demo's and the tests')
- ``demo.py``       ``arceusd demo`` on top of it
"""

from arceusd.cli.commands import cli, main

__all__ = ["cli", "main"]
