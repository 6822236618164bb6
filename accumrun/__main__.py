"""``python -m accumrun`` is the ``accumrun`` command."""

from accumrun.cli import main

main(prog_name="accumrun")
