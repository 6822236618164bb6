"""Benchmark how fast accumrun starts: from the command to the first update, and to the exit, against TensorFlow's
own import, on the same machine, in fresh processes.

Measured, each ``--repeats`` times (medians reported):

- ``python -c "import tensorflow"``: the floor every TensorFlow command pays;
- ``accumrun check configs/digits.yaml``: it loads the data, builds the model and prints, tracing no step;
- ``accumrun train configs/digits.yaml --set training.epochs=1``: the time to the first update (the first call
  into the batches returning, so the step's tracing is inside it) and to the exit (saving the model included).

The first update is seen from inside the child: it runs the command line through this script's ``--child``, which
wraps the training batches' ``run`` to print the wall time (``time.time()``) when the first call returns; the parent
subtracts the time it started the child. Run from the repository root; it writes ``docs/benchmarks-startup.md``
and the figures beside it:

    python benchmarks/startup.py [--repeats N] [--output PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from run import machine, publish_report  # benchmarks/run.py, beside this script

MARK = "first update at "


def _child(args: list[str]) -> None:
    """Run ``accumrun ARGS``, printing the time when the first training call returns."""
    from accumrun.cli import main
    from accumrun.training.batches import DeviceBatches, FedBatches

    seen = []

    def timing(run: Any) -> Any:
        def timed(self: Any, *call: int) -> Any:
            result = run(self, *call)
            if not seen:
                seen.append(True)
                print(f"{MARK}{time.time()}", file=sys.stderr, flush=True)
            return result

        return timed

    for kind in (DeviceBatches, FedBatches):
        kind.run = timing(kind.run)  # type: ignore[method-assign]
    main(args, prog_name="accumrun")


def _timed(command: list[str]) -> tuple[float, float | None]:
    """Seconds from start to exit, and to the first update when the command reports one."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    ended = time.time()
    if done.returncode:
        raise SystemExit(f"{command} failed:\n{done.stderr[-2000:]}")
    marks = [line for line in done.stderr.splitlines() if line.startswith(MARK)]
    first = float(marks[0].removeprefix(MARK)) - started if marks else None
    return ended - started, first


def main() -> None:
    """Time each command ``--repeats`` times; print the report, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-startup.md"))
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child)
        return
    info = machine()
    python = sys.executable
    figures: dict[str, list[float]] = {
        "import tensorflow": [],
        "check": [],
        "train: first update": [],
        "train: exit": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            print(f"round {repeat + 1} of {args.repeats} ...", file=sys.stderr, flush=True)
            figures["import tensorflow"].append(_timed([python, "-c", "import tensorflow"])[0])
            figures["check"].append(_timed([python, "-m", "accumrun", "check", "configs/digits.yaml"])[0])
            run_dir = str(Path(folder) / f"run{repeat}")
            train = ["train", "configs/digits.yaml", "--set", "training.epochs=1", "--run-dir", run_dir]
            wall, first = _timed([python, __file__, "--child", *train])
            figures["train: exit"].append(wall)
            figures["train: first update"].append(first if first is not None else float("nan"))
    medians = {name: statistics.median(values) for name, values in figures.items()}
    floor = medians["import tensorflow"]
    publish_report(
        args.output,
        title="Startup: from the command to the first update",
        command="python benchmarks/startup.py",
        info=info,
        figures={"median_seconds": medians, "seconds": figures},
        body=[
            f"Fresh processes, the median of {args.repeats}; `configs/digits.yaml`, 1 epoch for `train`.\n",
            "| command | seconds | minus `import tensorflow` |\n| --- | ---: | ---: |",
            *(f"| {name} | {value:.2f} | {value - floor:+.2f} |" for name, value in medians.items()),
        ],
    )


if __name__ == "__main__":
    main()
