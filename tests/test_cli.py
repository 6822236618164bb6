"""The command line: exit codes, output and files. Parsing, usage and errors run in this process through click's
runner; a real process shows what only it can: that TensorFlow stays unloaded for --help, an empty stderr, and
Ctrl-C with the printed resume command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import pytest

from tests.helpers import invoke, tiny_config


@pytest.mark.subprocess
def test_help_does_not_import_tensorflow() -> None:
    probe = (
        "import sys\n"
        "from accumrun.cli import main\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('tensorflow loaded' if 'tensorflow' in sys.modules else 'tensorflow not loaded')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "--no-subdivisions" in result.stdout
    assert result.stdout.strip().endswith("tensorflow not loaded")


@pytest.mark.slow
def test_train_writes_the_run_directory(tmp_path: Path) -> None:
    result = invoke("train", str(tiny_config(tmp_path)), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "batch 10 = 3 sub-batches x 3-4 samples; 3 updates per epoch" in result.stdout
    assert "epoch 2/2 | loss " in result.stdout and "samples/s" in result.stdout
    assert "Traceback" not in result.stderr and "cuda" not in result.stderr.lower()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["optimizer_steps"] == 6
    # The summary: epochs, wall time, the speed after the first epoch, the best val_loss, where the model is.
    best = min(rows, key=lambda row: row["val_loss"])
    summary = re.escape(
        f"| {rows[1]['samples_per_second']:,.0f} samples/s after the first "
        f"| best val_loss {best['val_loss']:.4f} at epoch {best['epoch']} | model {tmp_path / 'run' / 'model.keras'}"
    )
    assert re.fullmatch(rf"done: 2 epochs in \d+\.\d s {summary}", result.stdout.splitlines()[-1])
    assert keras.models.load_model(tmp_path / "run" / "model.keras").output_shape == (None, 3)


def test_no_subdivisions_and_overrides_reach_the_config(tmp_path: Path) -> None:
    result = invoke("check", str(tiny_config(tmp_path)), "--no-subdivisions", "--epochs", "7", "--set", "seed=11")
    assert result.returncode == 0, result.stderr
    assert "subdivisions: 1\n" in result.stdout and "epochs: 7\n" in result.stdout and "seed: 11\n" in result.stdout
    assert "batch 10 = 1 sub-batch x 10 samples; 3 updates per epoch (last batch 3 = 1 sub-batch x 3 samples)" in (
        result.stdout
    )
    # The loss and metrics the task implies, and whether the loss reads logits, resolved in the printed config.
    assert "loss sparse_categorical_crossentropy, from_logits=True; metrics accuracy\n" in result.stdout
    assert "loss:\n  name: sparse_categorical_crossentropy\n  from_logits: true\n" in result.stdout


def test_bad_config_exits_1_with_every_problem_and_no_traceback(tmp_path: Path) -> None:
    path = tiny_config(tmp_path, training={"subdivisions": 0, "epochs": -1})
    result = invoke("train", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 1
    assert "Error: 2 problems in" in result.stderr
    assert (
        "training.subdivisions: must be a positive integer or 'auto' (find the fewest that fit in memory) (got 0)"
        in result.stderr
    )
    assert "training.epochs: input should be greater than or equal to 1 (got -1)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_bad_usage_exits_2() -> None:
    result = invoke("train", "missing.yaml", "--batch-size", "zero")
    assert result.returncode == 2
    assert "Usage:" in result.stderr and "'zero' is neither a positive integer nor 'full'" in result.stderr
    both = invoke("train", "missing.yaml", "--subdivisions", "2", "--no-subdivisions")
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_unexpected_failure_is_one_line_not_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_model.py").write_text(
        "def build(input_shape, classes, **kwargs):\n    raise RuntimeError('boom')\n"
    )
    path = tiny_config(tmp_path, model={"name": "broken_model:build"})
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 1
    assert "Error: unexpected RuntimeError: boom" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_in_the_default_folder_starts_quietly_and_a_closed_stdout_does_not_end_it(tmp_path: Path) -> None:
    """``accumrun train tiny.yaml | head -1`` in a folder of its own: the reader goes away after the first line; the
    run completes unseen, into ``runs/``, with nothing at all on stderr (one process shows both)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "accumrun", "train", str(tiny_config(tmp_path, training={"epochs": 3}))],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"accumrun ")
    process.stdout.close()
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, stderr
    # Empty: no broken pipe, no traceback, and no TensorFlow start-up chatter (resolving output.run_dir must not
    # import TensorFlow before that chatter is hidden).
    assert stderr.strip() == "", stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny-")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert len(_logged_epochs(run_dir)) == 3 and (run_dir / "model.keras").is_file()


EPOCHS = 6


@pytest.mark.slow
@pytest.mark.subprocess
def test_ctrl_c_then_the_printed_command_completes_the_run(tmp_path: Path) -> None:
    """A user's Ctrl-C: the run stops at a batch boundary, says how to resume, and the resumed run logs each
    epoch once."""
    run_dir = tmp_path / "run"
    # Each forward pass pauses 0.1 s in this process alone (9 per epoch), so it is still training when the signal
    # comes, however fast or loaded the machine; the resumed run does not pause, so its 5 epochs are quick.
    config = tiny_config(tmp_path, model={"name": "tests.hook_models:mlp", "hidden": [8]})
    process = subprocess.Popen(
        [sys.executable, "-m", "accumrun", "train", str(config), "--epochs", str(EPOCHS)]
        + ["--run-dir", str(run_dir), "--no-tensorboard"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "ACCUMRUN_TEST_PAUSE_AT_FORWARD": "0.1"},
    )
    try:
        deadline = time.monotonic() + 120
        while not _logged_epochs(run_dir) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    resume_line = stderr.strip().splitlines()[-1]
    assert resume_line.startswith("resume with: ")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    stopped_at = len(_logged_epochs(run_dir))
    assert 1 <= stopped_at < EPOCHS

    # Exactly as printed, by a shell whose PATH has no virtual environment on it.
    resumed = subprocess.run(
        resume_line.removeprefix("resume with: "),
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [row["epoch"] for row in _logged_epochs(run_dir)] == list(range(1, EPOCHS + 1))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"


def _logged_epochs(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# A layer that fails only where the train step traces it (training=True), so the error comes out of tf.function
# as "in user code:", a stack, and "ValueError: ..." again on its last line.
FAILS_IN_THE_STEP = """
import keras


class FailsWhenTraining(keras.layers.Layer):
    def call(self, x, training=None):
        if training:
            raise ValueError("no gradient for you")
        return x


def build(input_shape, classes, **unused):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(classes)(FailsWhenTraining()(inputs)))
"""


@pytest.mark.slow
def test_an_error_from_inside_a_compiled_step_names_its_cause_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fails_in_the_step.py").write_text(FAILS_IN_THE_STEP)
    path = tiny_config(tmp_path, model={"name": "fails_in_the_step:build"})
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "Error: unexpected ValueError in FailsWhenTraining.call(): no gradient for you "
        "(set ACCUMRUN_TRACEBACK=1 to see where)"
    ], result.stderr
