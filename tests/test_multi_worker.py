"""Multi-worker runs on local processes (``accumrun launch``): two workers train like one process, stop together
on Ctrl-C and resume to the same weights, survive a killed worker (all in one run), pass SIGTERM on and agree on
it (in-process), and read a Slurm cluster.

Each worker is one replica on the CPU, on free localhost ports; the runs are short (small data, a few epochs).

Tolerance of the launched run against one process (1e-5): both take the same Adam updates from the same weights on
the same samples; they differ only in the order of float32 sums (each worker sums its 4 or 5 samples' gradients in
sub-batches, the all-reduce adds the two). A gradient entry sums n = 9 terms: Higham's bound n * 2^-24 = 5.4e-7,
relative to the sum of the terms' magnitudes. Adam moves a weight by the learning rate (0.02) times the gradient over
its running root mean square, and that sum of magnitudes is within a few (say 3) of the running root mean square
here (the samples' gradients do not cancel out over a batch of 9 at these losses), so each update moves the two
runs apart by at most 0.02 * 5.4e-7 * 3 = 3.2e-8 per weight; over the run's 24 * 5 = 120 updates that is 3.9e-6 if
every rounding went the same way, and 1e-5 leaves a factor 2.5 on that worst case.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import train
from accumrun.launcher import launch
from accumrun.training import distribute
from accumrun.training.distribute import cluster_resolver
from tests.helpers import max_difference, write_config

TIMEOUT = 240
EPOCHS = 5
GIVE_UP = 15  # distribute.timeout_seconds


def config(tmp_path: Path) -> Path:
    """An MLP without BatchNorm; 208 training samples in 23 batches of 9 and a last one of 1, each batch dealt out
    to 2 workers (4 + 5 samples, the last 0 + 1), each cut in 3 sub-batches; 5 epochs, checkpoints at epoch ends
    (after the first epoch of each of the first two launches, a stop leaves 3 or more epochs to stop in).
    18 validation samples: two batches of 9, one batch size to trace for validation in each of the six workers.

    A worker that stops answering is given up after 15 s: long enough for a loaded machine's slowest collective,
    short enough that the test does not wait out the default 300 s (or 30 s)."""
    return write_config(
        tmp_path / "multi.yaml",
        seed=5,
        data={"name": "synthetic", "samples": 226, "shape": [6], "classes": 3, "validation_split": 0.08},
        model={"name": "mlp", "hidden": [16], "dropout": 0.0},
        training={"epochs": EPOCHS, "batch_size": 9, "subdivisions": 3},
        optimizer={"name": "adam", "learning_rate": 0.02},
        output={"tensorboard": False, "checkpoint_every": None},
        distribute={"timeout_seconds": GIVE_UP},
    )


def start(tmp_path: Path, *args: str, scratch: str = "tmp") -> subprocess.Popen[str]:
    """``accumrun launch --workers 2 ARGS`` in the background, its output in ``tmp_path/launch-N.log``, the system
    temp folder (where the other worker keeps its scratch folder) at ``tmp_path/scratch``."""
    log = tmp_path / f"launch-{len(list(tmp_path.glob('launch-*.log')))}.log"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(tmp_path / scratch)}
    (tmp_path / scratch).mkdir(exist_ok=True)
    with log.open("w") as output:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "accumrun", "launch", "--workers", "2", *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )


def finish(process: subprocess.Popen[str], tmp_path: Path) -> tuple[int, str]:
    try:
        code = process.wait(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    logs = sorted(tmp_path.glob("launch-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    return code, logs[-1].read_text()


def wait_for_an_epoch(launcher: subprocess.Popen[str], tmp_path: Path) -> None:
    """Wait until the newest launch's chief has logged an epoch (so its launcher handles signals by now)."""
    deadline = time.monotonic() + TIMEOUT
    log = sorted(tmp_path.glob("launch-*.log"), key=lambda p: int(p.stem.split("-")[1]))[-1]
    while time.monotonic() < deadline and launcher.poll() is None:
        if "[w0] epoch " in log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"the launch never logged an epoch:\n{log.read_text()}")


def weights(run_dir: Path) -> list[np.ndarray]:
    return keras.models.load_model(run_dir / "model.keras", compile=False).get_weights()


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_launched_workers_stopped_two_ways_resume_to_the_weights_of_one_process(tmp_path: Path) -> None:
    """One run on two launched workers, stopped two ways in turn (each launch resumes the last): Ctrl-C stops both
    workers at the same batch; a killed worker stops the other within the timeout. The last launch finishes it, to
    one process's weights, and only the chief wrote anything. (SIGTERM takes Ctrl-C's path: the tests below pass it
    on and agree on it in-process, and tests/test_resume.py stops and resumes a run with it.)

    One run for all of it: each launch starts three processes that import TensorFlow, and a stopped run resumed to
    one process's weights also shows that two workers train like one process. The one process trains here, in a
    thread, while the chief waits out its lost worker and the last launch starts: time this test spent idle."""
    path = config(tmp_path)
    run_dir = tmp_path / "run"
    launcher = start(tmp_path, str(path), "--run-dir", str(run_dir))
    wait_for_an_epoch(launcher, tmp_path)
    launcher.send_signal(signal.SIGINT)
    code, output = finish(launcher, tmp_path)
    assert code == 130, output
    stops = re.findall(r"\[w(\d)\] SIGINT at epoch (\d+), batch (\d+); saved ", output)
    assert len(stops) == 2 and stops[0][1:] == stops[1][1:], output
    assert f"[launch] resume with: {sys.executable} -m accumrun launch --workers 2 --resume {run_dir}" in output
    # How the launch set up its workers.
    assert re.search(
        r"\[w0\] distribute multi_worker: 2 replicas on 2 workers \(cluster from TF_CONFIG; chief worker 0 "
        r"at localhost:\d+\); this is worker 0 \(the chief",
        output,
    )
    assert "[w1] distribute multi_worker" in output and "this is worker 1 (writes nothing" in output
    assert "[w0] batch 9 = 2 replicas x 4-5 samples, each in 3 sub-batches x 1-2 samples" in output

    launcher = start(tmp_path, "--resume", str(run_dir))
    # Once this launch has logged an epoch (checkpointed at its end), past the workers' first collectives.
    wait_for_an_epoch(launcher, tmp_path)
    log = sorted(tmp_path.glob("launch-*.log"), key=lambda p: int(p.stem.split("-")[1]))[-1].read_text()
    worker = int(re.search(r"\[launch\] worker 1: pid (\d+)", log).group(1))  # type: ignore[union-attr]
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        reference = pool.submit(train, path, tmp_path / "single", quiet=True)
        code, output = finish(launcher, tmp_path)
        assert time.monotonic() - killed < GIVE_UP + 15
        assert code == 75, output
        assert re.search(
            rf"\[w0\] Error: worker 1 \(localhost:\d+\) stopped answering \(distribute\.timeout_seconds: {GIVE_UP}\); "
            rf"the last checkpoint is intact: restart every worker with --resume {run_dir}",
            output,
        ), output
        assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"

        code, output = finish(start(tmp_path, "--resume", str(run_dir), scratch="last"), tmp_path)
        assert code == 0, output
        # Keras keeps global state (the seeded generator a build draws from): no model is loaded here until the one
        # process is done.
        expected = reference.result().model.get_weights()
    assert max_difference(weights(run_dir), expected) < 1e-5
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == list(range(1, EPOCHS + 1))
    assert {row["replicas"] for row in rows} == {2} and rows[-1]["optimizer_steps"] == 24 * EPOCHS
    # The other worker of the launch that finished wrote only into its scratch folder, which is gone.
    assert list((tmp_path / "last").iterdir()) == []


# A worker that stops as `accumrun train` does on SIGTERM: it says where, and exits 128 + the signal.
FAKE_WORKER = """
import signal, sys, time
def stop(number, frame):
    print(f"{signal.Signals(number).name} at epoch 1, batch 3; saved", flush=True)
    sys.exit(128 + number)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_launcher_passes_sigterm_on_to_every_worker_and_exits_with_the_chiefs_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kwargs: popen([args[0], "-c", FAKE_WORKER], **kwargs))
    lines: list[str] = []

    def terminate_once_both_are_ready() -> None:
        deadline = time.monotonic() + TIMEOUT
        while sum(line.endswith("] ready") for line in lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(terminate_once_both_are_ready)
        code = launch(2, ["config.yaml"], lines.append)
    assert code == 143, lines
    assert "[launch] SIGTERM: passed on to the 2 workers" in lines
    assert {"[w0] SIGTERM at epoch 1, batch 3; saved", "[w1] SIGTERM at epoch 1, batch 3; saved"} <= set(lines)
    assert lines[-1] == "[launch] exit statuses [143, 143]; worker 0's is the launcher's"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("asked", [signal.SIGTERM, signal.SIGINT, None])
def test_the_workers_agree_on_a_stop_for_either_signal(monkeypatch: pytest.MonkeyPatch, asked: int | None) -> None:
    # The all-reduce the workers agree by, on this process's one replica, as worker 0 of two.
    monkeypatch.setattr(distribute, "task_addresses", lambda strategy: {"worker 0": "a:1", "worker 1": "b:1"})
    monkeypatch.setattr(distribute, "is_chief", lambda strategy: True)
    agree = distribute.agreement(tf.distribute.get_strategy())
    assert agree(distribute.Agreed(asked, 3, True)) == distribute.Agreed(asked, 3, True)


def test_a_slurm_job_step_resolves_to_one_worker_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name, value in {
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "node[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }.items():
        monkeypatch.setenv(name, value)
    resolver = cluster_resolver("auto")
    assert resolver.cluster_spec().as_dict() == {"worker": ["node07:8888", "node08:8888"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    # No GPU here (no nvidia-smi): each worker's replica goes on its CPU.
    assert resolver.num_accelerators() == {}
