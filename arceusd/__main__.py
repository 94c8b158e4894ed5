"""``python -m arceusd`` is the ``arceusd`` command."""

from arceusd.cli.commands import main

main()
