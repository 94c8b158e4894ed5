"""``python -m arceusd`` is the ``arceusd`` command."""

from arceusd.cli import main

main()
