"""The command line: exit codes, output and files. Parsing, usage and errors run in this process through click's
runner; a real process shows what only it can: that TensorFlow stays unloaded for --help, an empty stderr, and
Ctrl-C with the printed resume command."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import pytest

from tests.helpers import child_import_path, invoke, start_paused, tiny_config


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
    # 22 samples: 20 to train on in two whole batches, so the step is traced for one batch size alone (the short
    # last batch is printed by the check below and trained in test_run.py).
    result = invoke("train", str(tiny_config(tmp_path, data={"samples": 22})), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "batch 10 = 3 sub-batches x 3-4 samples; 2 updates per epoch" in result.stdout
    assert "epoch 2/2 | loss " in result.stdout and "samples/s" in result.stdout
    assert "Traceback" not in result.stderr and "cuda" not in result.stderr.lower()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["optimizer_steps"] == 4
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
        "def locked(input_shape, classes, **kwargs):\n    raise PermissionError(13, 'Permission denied', '/data/x')\n"
    )
    monkeypatch.chdir(tmp_path)
    # An error the file system raised for a path says the path and why, as the operating system words it.
    for builder, expected in (("build", "unexpected RuntimeError: boom"), ("locked", "/data/x: Permission denied")):
        path = tiny_config(tmp_path, model={"name": f"broken_model:{builder}"})
        result = invoke("train", str(path), "--run-dir", str(tmp_path / "run"))
        assert result.returncode == 1 and f"Error: {expected}" in result.stderr and "Traceback" not in result.stderr


EPOCHS = 6


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_quiet_run_in_the_default_folder_outlives_a_closed_stdout_stops_on_ctrl_c_and_resumes_as_printed(
    tmp_path: Path,
) -> None:
    """``accumrun train tiny.yaml | head -1`` in a folder of its own, then a user's Ctrl-C, then the printed command,
    also read by ``head -1``. Two processes show what three did: the run goes into ``runs/``, outlives the reader
    that went away after the first line, stops at a batch boundary with nothing on stderr but the stop and how to
    resume; the resumed run completes unseen, with nothing at all on stderr, and logs each epoch once."""
    # Each forward pass pauses 0.1 s in the first process alone (6 per epoch), so it is still training when the
    # signal comes, however fast or loaded the machine; the resumed run does not pause, so its epochs are quick.
    # Both processes run in tmp_path, and import this checkout (and its tests.hook_models) from there.
    # 22 samples: 20 to train on, two whole batches, so each process traces the step for one batch size.
    config = tiny_config(tmp_path, data={"samples": 22}, model={"name": "tests.hook_models:mlp", "hidden": [8]})
    process = start_paused(["-m", "accumrun", "train", str(config), "--epochs", str(EPOCHS)], tmp_path)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("accumrun ")
        process.stdout.close()  # the epoch lines to come go to a closed pipe
        deadline = time.monotonic() + 120
        while not _epochs_in_runs(tmp_path) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    # Only the stop and how to resume: no broken pipe, no traceback, and no TensorFlow start-up chatter (resolving
    # output.run_dir must not import TensorFlow before that chatter is hidden).
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 3, stderr
    assert lines[0] == "SIGINT: stopping after the updates under way (Ctrl-C again to stop at once)"
    assert re.fullmatch(r"SIGINT at epoch \d+, batch \d+; saved runs/tiny-\S+/checkpoints/\S+", lines[1]), stderr
    assert lines[2].startswith("resume with: ")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny-")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert 1 <= len(_logged_epochs(run_dir)) < EPOCHS

    # Exactly as printed, in the same folder, by a shell whose PATH has no virtual environment on it.
    resumed = subprocess.Popen(
        lines[2].removeprefix("resume with: "),
        shell=True,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": child_import_path(), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert resumed.stdout is not None and resumed.stderr is not None
    assert resumed.stdout.readline().startswith("accumrun ")
    resumed.stdout.close()
    with resumed.stderr:
        stderr = resumed.stderr.read()
    assert resumed.wait(timeout=300) == 0, stderr
    assert stderr.strip() == "", stderr
    assert [row["epoch"] for row in _logged_epochs(run_dir)] == list(range(1, EPOCHS + 1))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert (run_dir / "model.keras").is_file()


def _epochs_in_runs(folder: Path) -> list[dict]:
    """The epochs logged so far by the one run under ``folder/runs`` (none before it is made)."""
    runs = list((folder / "runs").glob("*")) if (folder / "runs").is_dir() else []
    return [row for run_dir in runs for row in _logged_epochs(run_dir)]


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
