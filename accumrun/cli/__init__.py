"""The command line: one module per command, each parsing its arguments, calling the Python API and printing.

The group, its mapping of failures to exit codes and the process's start and end are in :mod:`accumrun.cli.group`;
the options that several commands share are in :mod:`accumrun.cli.options`. TensorFlow is imported inside the
command bodies only, so ``accumrun --help`` answers at once.
"""

# Imported under other names, so that accumrun.cli.train (and the others) stay the modules of the commands.
from accumrun.cli.check import check as _check
from accumrun.cli.compare import compare as _compare
from accumrun.cli.download import download as _download
from accumrun.cli.evaluate import evaluate as _evaluate
from accumrun.cli.export import export as _export
from accumrun.cli.generate import generate as _generate
from accumrun.cli.group import main, run
from accumrun.cli.launch import launch as _launch
from accumrun.cli.make_example import make_example as _make_example
from accumrun.cli.plan import plan as _plan
from accumrun.cli.plot import plot as _plot
from accumrun.cli.predict import predict as _predict
from accumrun.cli.train import train as _train

_COMMANDS = (
    _train,
    _check,
    _plan,
    _compare,
    _launch,
    _evaluate,
    _predict,
    _generate,
    _export,
    _plot,
    _download,
    _make_example,
)
for _command in _COMMANDS:
    main.add_command(_command)

__all__ = ["main", "run"]
