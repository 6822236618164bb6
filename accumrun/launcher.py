"""``accumrun launch``: N local ``accumrun train`` workers of one multi-worker run, on this host.

Each worker is a process of its own, in a session of its own (so that a Ctrl-C at the terminal reaches the
launcher alone), with a ``TF_CONFIG`` that names every worker on a free localhost port and its own index.
The launcher prefixes each line a worker prints with ``[wI] ``, forwards each SIGINT or SIGTERM it gets to every
worker once (they agree on the batch to stop at, and the chief saves a checkpoint there; a second one kills
them), and exits with the chief's (worker 0's) status, or 75 if the chief is lost. It is for trying multi-worker
training, for one big host, and for the tests; on several hosts, each host runs ``accumrun train`` with its own
``TF_CONFIG`` (or under Slurm).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from accumrun.errors import WorkerLost
from accumrun.kinds import RunState
from accumrun.rundir.status import read_status

FORWARDED = (signal.SIGINT, signal.SIGTERM)


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now, chosen by the OS (released before the workers bind them)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("localhost", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


def launch(workers: int, train_args: Sequence[str], echo: Callable[[str], None], grace_seconds: float = 330.0) -> int:
    """Run ``accumrun train TRAIN_ARGS`` as ``workers`` local workers; return worker 0's exit status, or 75 (a lost
    worker's) when something other than the launcher killed worker 0.

    A second SIGINT or SIGTERM kills the workers at once. When a worker fails, the others get ``grace_seconds``
    (longer than the run's collective timeout) to notice and stop by themselves before they are killed.
    """
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    processes: list[subprocess.Popen[str]] = []
    copiers: list[threading.Thread] = []
    forwarded: set[int] = set()
    killed_by: list[int] = []
    """128 + the signal, when a second SIGINT or SIGTERM made the launcher kill the workers."""

    def forward(number: int, frame: FrameType | None) -> None:
        if number in forwarded:
            echo(f"[launch] {signal.Signals(number).name} again: killing the workers")
            killed_by.append(128 + number)
            _kill(processes)
            return
        forwarded.add(number)
        echo(f"[launch] {signal.Signals(number).name}: passed on to the {workers} workers")
        for process in processes:
            if process.poll() is None:
                process.send_signal(number)

    previous = {number: signal.signal(number, forward) for number in FORWARDED}
    try:
        for index in range(workers):
            task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            process = subprocess.Popen(
                [sys.executable, "-m", "accumrun", "train", *train_args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "TF_CONFIG": json.dumps(task)},
                start_new_session=True,
            )
            processes.append(process)
            assert process.stdout is not None
            copier = threading.Thread(target=_copy, args=(process.stdout, f"[w{index}] ", echo), daemon=True)
            copier.start()
            copiers.append(copier)
            echo(f"[launch] worker {index}: pid {process.pid}, {cluster['worker'][index]}")
        codes, killed_after_failure = _wait(processes, grace_seconds, echo)
        for copier in copiers:
            copier.join()
    finally:
        _kill(processes)
        for number, handler in previous.items():
            signal.signal(number, handler)
    if killed_by:
        echo(f"[launch] exit statuses {codes}; the launcher killed the workers, so its status is {killed_by[0]}")
        return killed_by[0]
    if killed_after_failure:
        # A worker that died of a signal nobody here sent was lost.
        failed = next((code for code in codes if code > 0), WorkerLost.exit_code)
        echo(f"[launch] exit statuses {codes}; the launcher killed the workers after one failed with {failed}")
        return failed
    return _launcher_status(codes, echo)


def _launcher_status(codes: list[int], echo: Callable[[str], None]) -> int:
    """Worker 0's exit status, or 75 (a lost worker's) when something killed it: a negative status is a worker
    killed by that signal, without a word."""
    if codes[0] < 0:
        echo(f"[launch] exit statuses {codes}; worker 0 was lost, so the launcher's is {WorkerLost.exit_code}")
        return WorkerLost.exit_code
    echo(f"[launch] exit statuses {codes}; worker 0's is the launcher's")
    return codes[0]


def _wait(
    processes: list[subprocess.Popen[str]], grace_seconds: float, echo: Callable[[str], None]
) -> tuple[list[int], bool]:
    """Every worker's exit status, and whether the launcher killed some: once one has failed, the others are
    killed after ``grace_seconds``."""
    deadline: float | None = None
    killed = False
    while any(process.poll() is None for process in processes):
        if deadline is None and any(process.returncode not in (None, 0) for process in processes):
            deadline = time.monotonic() + grace_seconds
        if deadline is not None and time.monotonic() > deadline:
            echo(f"[launch] a worker failed and the others did not stop within {grace_seconds:.0f} s: killing them")
            _kill(processes)
            killed = True
        time.sleep(0.2)
    return [process.returncode for process in processes], killed


def _kill(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def resume_hint(workers: int, run_dir: Path) -> str | None:
    """The command that resumes the launched run in ``run_dir``; None when it completed or has no checkpoint."""
    if not (run_dir / "checkpoints").is_dir() or read_status(run_dir) == RunState.COMPLETED:
        return None
    return shlex.join([sys.executable, "-m", "accumrun", "launch", "--workers", str(workers), "--resume", str(run_dir)])


def _copy(stream: IO[str], prefix: str, echo: Callable[[str], None]) -> None:
    """Echo each line of a worker's output with ``prefix``; close the pipe when the worker's output ends."""
    with stream:
        for line in stream:
            echo(prefix + line.rstrip("\n"))
