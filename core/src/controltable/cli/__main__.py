"""``python -m controltable.cli``: runs the ``controltable`` command."""

from . import main

main()
