"""``python -m accumrun`` and the ``accumrun`` command (setup.cfg's entry point is :func:`main`).

Importing the command line (click and every command) takes about half a second; Ctrl-C during it exits 130, as it
would a moment later (see :mod:`accumrun.cli.group`), not with a traceback.
"""

import sys


def main() -> None:
    """Import the command line and run it."""
    try:
        from accumrun.cli import run
    except KeyboardInterrupt:
        print("\nstopped by Ctrl-C", file=sys.stderr)
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
