"""``python -m minou`` is the ``minou`` command."""

from .cli import main

main()
