"""``python -m accumrun`` is the ``accumrun`` command."""

from accumrun.cli import run

run()
