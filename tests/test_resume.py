"""Checkpoints, resume, graceful stops and non-finite batches, in process (signals sent to this process)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from accumrun import train
from accumrun.config.loading import load_config, load_resume_config
from accumrun.errors import ConfigError, Interrupted, TrainingDiverged
from accumrun.rundir.atomic import sweep_leftovers
from accumrun.training.checkpoints import CheckpointStore
from accumrun.training.runner import RunResult
from accumrun.training.signals import StopRequests, resume_command
from tests import hook_models
from tests.helpers import invoke, run_cli, signal_after_batch, tiny_config, write_config

# Keys that measure the machine, not the training; they differ between any two runs.
TIMING_KEYS = {"seconds", "measure_seconds", "samples_per_second", "peak_rss_mib", "peak_device_mib"}


def training_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def a_dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    return ended.pid


THREE_EPOCHS = {"epochs": 3, "measure": ["noise_scale"]}


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The tiny config trained for 3 epochs without TensorBoard, measuring its noise scale, uninterrupted (read
    only)."""
    folder = tmp_path_factory.mktemp("three-epochs")
    path = tiny_config(folder, training=THREE_EPOCHS, output={"tensorboard": False})
    return train(load_config(path), folder / "run", quiet=True)


def copy_run(three_epochs: RunResult, tmp_path: Path) -> Path:
    """A copy of the ``three_epochs`` run at ``tmp_path/run``, and its config beside it; return the config's path."""
    shutil.copytree(three_epochs.run_dir, tmp_path / "run")
    return tiny_config(tmp_path, training=THREE_EPOCHS, output={"tensorboard": False})


@pytest.mark.parametrize(("signal_number", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_exits_128_plus_its_signal(
    signal_number: int, exit_code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert Interrupted(signal_number, "stopped", "accumrun train --resume run").exit_code == exit_code
    # What the signal prints: after a Ctrl-C, another stops at once; after a SIGTERM, the first does.
    with StopRequests() as requests:
        signal.raise_signal(signal_number)
    assert requests.signal_number == signal_number
    again = " again" if signal_number == signal.SIGINT else ""
    name = signal.Signals(signal_number).name
    assert (
        capsys.readouterr().err == f"\n{name}: stopping after the updates under way (Ctrl-C{again} to stop at once)\n"
    )


@pytest.mark.slow
def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, three_epochs: RunResult
) -> None:
    # SIGTERM here; Ctrl-C takes the same path (StopRequests, below), and stops and resumes a multi-worker run in
    # tests/test_multi_worker.py.
    path = tiny_config(tmp_path, training=THREE_EPOCHS, output={"tensorboard": False})
    reference = three_epochs

    # 3 batches per epoch: batch 5 is the middle batch of epoch 2, so the run stops mid-epoch.
    signal_after_batch(monkeypatch, 5, [signal.SIGTERM])
    with pytest.raises(Interrupted) as stopped:
        train(load_config(path), tmp_path / "run", quiet=True)
    monkeypatch.undo()
    assert stopped.value.exit_code == 143
    assert stopped.value.reason.startswith("SIGTERM at epoch 2, batch 2")
    assert f"at epoch 2, batch 2; saved {tmp_path / 'run' / 'checkpoints'}" in stopped.value.message
    assert stopped.value.message.endswith(f"resume with: {resume_command(tmp_path / 'run')}")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"
    assert len(training_rows(tmp_path / "run")) == 1

    # As if this process had spent 1000 s on the epoch's two batches: none of that is the resuming process' time.
    checkpoint = CheckpointStore(tmp_path / "run" / "checkpoints", keep=3).latest()
    assert checkpoint is not None
    with np.load(checkpoint) as stored:
        arrays = dict(stored)
    position = json.loads(str(arrays["position"]))
    assert position["train_seconds"] > 0 and position["timed_samples"] == 20  # two batches of 10
    arrays["position"] = np.array(json.dumps({**position, "train_seconds": 1000.0}))
    np.savez(checkpoint, **arrays)

    # What a process killed while saving leaves (write_atomically's temporaries, Keras' folder beside one) is swept
    # on resume; a live process's is not.
    killed = a_dead_pid()
    left = [f".model.{killed}-0123abcd.partial.keras", f".model.{killed}-0123abcd.partial.keras.folder"]
    left_in_checkpoints = f".ckpt-1.{killed}-4567cdef.partial.npz"
    writing = f".model.best.{os.getpid()}-89abcdef.partial.keras"
    for name in [left[0], writing]:
        (tmp_path / "run" / name).write_bytes(b"half")
    (tmp_path / "run" / left[1] / "model.weights.h5").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / left_in_checkpoints).write_bytes(b"half")

    resumed = invoke("train", "--resume", str(tmp_path / "run"))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[-1].startswith("done: epochs 2 to 3 in ")
    assert [path.name for path in (tmp_path / "run").rglob("*.partial*")] == [writing]
    weights = keras.models.load_model(tmp_path / "run" / "model.keras", compile=False).get_weights()
    for mine, theirs in zip(weights, reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # The rows, the noise measured over the epoch cut in two and its average across epochs included; the resumed
    # epoch timed by this process alone.
    assert training_rows(tmp_path / "run") == training_rows(reference.run_dir)
    assert "gradient_noise_scale_ema" in training_rows(reference.run_dir)[-1]
    resumed_epoch = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
    assert resumed_epoch["seconds"] < 100 and resumed_epoch["samples_per_second"] > 0.1
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "completed" and len(status["resumed"]) == 1


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_leaves_the_last_checkpoint_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Checkpoints at the ends of epochs: the one of epoch 1 is the last before the stop.
    path = tiny_config(tmp_path, output={"checkpoint_every": None})
    signal_after_batch(monkeypatch, 5, [signal.SIGINT, signal.SIGINT])
    with pytest.raises(KeyboardInterrupt):
        train(load_config(path), tmp_path / "run", quiet=True)
    monkeypatch.undo()
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "interrupted" and "second Ctrl-C" in status["reason"]
    checkpoints = CheckpointStore(tmp_path / "run" / "checkpoints", keep=3).checkpoints()
    assert [c.name for c in checkpoints] == ["ckpt-epoch00001-batch0000003.npz"]
    assert not list((tmp_path / "run" / "checkpoints").glob(".*"))
    resumed = train(load_resume_config(tmp_path / "run", None), tmp_path / "run", quiet=True, resume=True)
    assert [row["epoch"] for row in resumed.metrics] == [1, 2]


@pytest.mark.slow
def test_a_finished_run_extends_to_a_longer_one_and_its_checkpoints_count_epochs_as_the_console_does(
    tmp_path: Path, three_epochs: RunResult
) -> None:
    path = tiny_config(
        tmp_path,
        training=THREE_EPOCHS,
        output={"tensorboard": False, "checkpoint_every_updates": 2, "keep_checkpoints": 2},
    )
    train(load_config(path, ["training.epochs=1"]), tmp_path / "run", quiet=True)
    with pytest.raises(ConfigError, match="has finished its 1 epoch; pass --epochs N"):
        train(load_resume_config(tmp_path / "run", None), tmp_path / "run", quiet=True, resume=True)
    folder = tmp_path / "run" / "checkpoints"
    # 3 batches an epoch: update 2 is epoch 1, batch 2; the epoch's end is its batch 3, not batch 0 of epoch 2.
    assert sorted(p.name for p in folder.iterdir()) == [
        "ckpt-epoch00001-batch0000002.npz",
        "ckpt-epoch00001-batch0000003.npz",
    ]
    # Earlier versions named the end of epoch 1 after the next epoch's start, and counted epochs from 0; the
    # newest is found by the position inside, whatever the names say.
    (folder / "ckpt-epoch00001-batch0000003.npz").rename(folder / "ckpt-epoch00001-batch0000000.npz")
    (folder / "ckpt-epoch00001-batch0000002.npz").rename(folder / "ckpt-epoch00000-batch0000002.npz")
    assert CheckpointStore(folder, keep=3).latest() == folder / "ckpt-epoch00001-batch0000000.npz"
    extended = load_resume_config(tmp_path / "run", None, ["training.epochs=3"])
    train(extended, tmp_path / "run", quiet=True, resume=True)
    # The longer run is the module's uninterrupted one (checkpoints change no row).
    assert training_rows(tmp_path / "run") == training_rows(three_epochs.run_dir)
    # Checkpoints every 2 updates and at epochs' ends, the newest 2 kept: those of updates 4 and 6 pushed out the
    # two named the old way; the newest two are update 8 (epoch 3, batch 2) and the end.
    names = [c.name for c in CheckpointStore(folder, keep=2).checkpoints()]
    assert names == ["ckpt-epoch00003-batch0000002.npz", "ckpt-epoch00003-batch0000003.npz"]


@pytest.mark.slow
def test_resume_refuses_a_changed_config_and_a_run_without_checkpoints(tmp_path: Path, three_epochs: RunResult) -> None:
    path = copy_run(three_epochs, tmp_path)
    with pytest.raises(ConfigError, match=r"differs from the run's in training\.batch_size \(10 -> 5\)"):
        load_resume_config(tmp_path / "run", path, ["training.batch_size=5"])
    for checkpoint in (tmp_path / "run" / "checkpoints").iterdir():
        checkpoint.unlink()
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        train(load_resume_config(tmp_path / "run", path), tmp_path / "run", quiet=True, resume=True)


def test_a_checkpoint_is_an_npz_as_numpy_writes_it_and_an_earlier_one_still_loads(tmp_path: Path) -> None:
    from accumrun.training.checkpoints import Position

    def state(seed: int) -> dict[str, list[Any]]:
        rng = np.random.default_rng(seed)
        shapes = {"model": [(3, 4), (4,)], "optimizer": [(), (3, 4)], "metrics": [(2,)]}
        return {
            group: [keras.Variable(rng.normal(size=s).astype(np.float32)) for s in each]
            for group, each in shapes.items()
        }

    saved, position = state(0), Position(epoch=2, batch=3, loss_sum=1.5, samples=7, units=7.0)
    path = CheckpointStore(tmp_path / "new", keep=2, batches_per_epoch=4, state=saved).save(position)
    arrays = {f"{group}/{i}": v.numpy() for group, variables in saved.items() for i, v in enumerate(variables)}
    with np.load(path) as stored:
        assert sorted(stored.files) == sorted([*arrays, "position"])
        for key, value in arrays.items():
            np.testing.assert_array_equal(stored[key], value)
    # A checkpoint that the earlier writer (np.savez of every array at once) left loads as before.
    (tmp_path / "old").mkdir()
    old = tmp_path / "old" / path.name
    np.savez(old, **arrays, position=np.array(json.dumps(dataclasses.asdict(position))))
    for written in (path, old):
        restored = state(1)
        assert CheckpointStore(written.parent, keep=2, state=restored).load(written) == dataclasses.replace(
            position, train_seconds=0.0, timed_samples=0
        )
        assert all(
            np.array_equal(a.numpy(), b.numpy()) for g in saved for a, b in zip(saved[g], restored[g], strict=True)
        )
    # Every shape is checked before any variable changes.
    other = state(1)
    other["optimizer"][1] = keras.Variable(np.zeros((4, 3), np.float32))
    before = [v.numpy() for variables in other.values() for v in variables]
    with pytest.raises(ConfigError, match="does not match the configured optimizer"):
        CheckpointStore(path.parent, keep=2, state=other).load(path)
    assert all(
        np.array_equal(a, v.numpy()) for a, v in zip(before, [v for vs in other.values() for v in vs], strict=True)
    )
    # A damaged file (cut short) is refused in one line, and never taken as the newest beside a whole one.
    damaged = old.with_name("ckpt-epoch00009-batch0000000.npz")
    damaged.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ConfigError, match=f"cannot read checkpoint {damaged.name}"):
        CheckpointStore(damaged.parent, keep=2, state=state(1)).load(damaged)
    assert CheckpointStore(damaged.parent, keep=2).latest() == old


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path, three_epochs: RunResult) -> None:
    copy_run(three_epochs, tmp_path)
    (tmp_path / "run" / "config.yaml").write_text((tmp_path / "run" / "config.yaml").read_text().replace("- 8", "- 9"))
    config = load_resume_config(tmp_path / "run", None, ["training.epochs=4"])
    with pytest.raises(ConfigError, match="does not match the configured model"):
        train(config, tmp_path / "run", quiet=True, resume=True)


@pytest.mark.slow
def test_a_completed_run_is_replaced_only_with_overwrite(tmp_path: Path, three_epochs: RunResult) -> None:
    path = copy_run(three_epochs, tmp_path)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="holds a completed run; pass --overwrite"):
        train(load_config(path), tmp_path / "run", quiet=True)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    result = train(load_config(path, ["training.epochs=1"]), tmp_path / "run", quiet=True, overwrite=True)
    assert [row["epoch"] for row in result.metrics] == [1]
    assert len(CheckpointStore(tmp_path / "run" / "checkpoints", keep=3).checkpoints()) == 1


def test_a_sweep_removes_only_a_dead_writers_temporaries(tmp_path: Path) -> None:
    dead = a_dead_pid()
    kept = ["model.keras", "ckpt-1.npz", ".notes", f".model.{os.getpid()}-0123abcd.partial.keras", "target"]
    swept = [f".model.{dead}-0123abcd.partial.keras", f".ckpt-2.{dead}-4567cdef.partial.npz"]
    for name in kept[:-1] + swept:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "inside").write_bytes(b"x")
    # Keras' folder beside a temporary; a link to a folder, under a pid no process can have.
    (tmp_path / f".model.{dead}-0123abcd.partial.keras.folder").mkdir()
    (tmp_path / f".model.{2**80}-89abcdef.partial.keras.folder").symlink_to(tmp_path / "target")
    sweep_leftovers(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(kept)
    assert (tmp_path / "target" / "inside").is_file()


def test_overwrite_leaves_folders_with_foreign_files_alone(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match=r"holds files accumrun did not write \(thesis\.tex\)"):
        train(load_config(tiny_config(tmp_path)), tmp_path / "run", quiet=True, overwrite=True)
    assert (tmp_path / "run" / "thesis.tex").read_text() == "precious"


# A model whose output is NaN for samples with a negative first feature, and finite for the others.
NAN_MODEL = """
import keras


class NanIfFirstFeatureNegative(keras.layers.Layer):
    def call(self, x):
        return x + 0.0 * keras.ops.log(x[:, :1])


def build(input_shape, classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(classes)(NanIfFirstFeatureNegative()(inputs)))
"""


def nan_sample_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_nonfinite: str) -> Path:
    """23 training samples, unshuffled, in batches of 10; sample 12 (in batch 2) makes the loss NaN."""
    (tmp_path / "nan_model.py").write_text(NAN_MODEL)
    monkeypatch.chdir(tmp_path)  # custom models are imported from the working directory
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 4)).astype(np.float32)
    x[:, 0] = np.abs(x[:, 0]) + 0.1
    x[12, 0] = -1.0
    np.savez(tmp_path / "nan.npz", x=x, y=rng.integers(3, size=23))
    return write_config(
        tmp_path / "nan.yaml",
        data={"name": "npz", "path": str(tmp_path / "nan.npz"), "validation_split": 0.0, "shuffle": False},
        model={"name": "nan_model:build"},
        training={"epochs": 2, "batch_size": 10, "subdivisions": 3, "on_nonfinite": on_nonfinite},
        optimizer={"name": "adam", "learning_rate": 0.01},
    )


@pytest.mark.slow
def test_skip_batch_drops_the_non_finite_update_and_counts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = train(load_config(nan_sample_config(tmp_path, monkeypatch, "skip_batch")), tmp_path / "run", quiet=True)
    assert [row["skipped_batches"] for row in result.metrics] == [1, 1]
    assert [row["optimizer_steps"] for row in result.metrics] == [2, 4]
    assert all(np.isfinite(row["loss"]) for row in result.metrics)
    assert all(np.isfinite(v.numpy()).all() for v in result.model.variables)


def test_stop_on_non_finite_stops_before_applying_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TrainingDiverged, match="the loss is nan at epoch 1, batch 2; that update was not applied"):
        train(load_config(nan_sample_config(tmp_path, monkeypatch, "stop")), tmp_path / "run", quiet=True)
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "failed" and "no checkpoint was taken yet" in status["reason"]
    assert not (tmp_path / "run" / "model.keras").exists()


def test_the_second_sigint_raises_keyboard_interrupt() -> None:
    # A background job (nohup, CI) may start with SIGINT ignored; whatever it was comes back afterwards.
    before = signal.getsignal(signal.SIGINT)
    with StopRequests() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.signal_number == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_killed_at_any_instant_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    # Full batch in 2 sub-batches: an update is two forward passes, an epoch one update; a checkpoint every 5, so
    # without validation every call runs up to 5 updates (epochs).
    path = write_config(
        tmp_path / "kill.yaml",
        seed=4,
        data={"name": "synthetic", "samples": 30, "shape": [4], "classes": 3, "validation_split": 0.0},
        model={"name": "tests.hook_models:mlp", "hidden": [8]},
        training={
            "epochs": 20,
            "batch_size": "full",
            "subdivisions": 2,
            "measure": ["noise_scale", "sharpness"],
            "measure_every": 5,
        },
        optimizer={"name": "adam", "learning_rate": 0.01},
        output={"tensorboard": False, "checkpoint_every_updates": 5},
    )
    reference = train(load_config(path), tmp_path / "reference", quiet=True)
    run_dir = tmp_path / "run"
    repository = Path(__file__).parent.parent
    # Killed in update 12 (after the checkpoint of update 10), then in update 10 + 9 = 19 of the resumed run.
    for args, forward in (([str(path), "--run-dir", str(run_dir)], 23), (["--resume", str(run_dir)], 17)):
        killed = run_cli("train", *args, cwd=repository, env={"ACCUMRUN_TEST_KILL_AT_FORWARD": str(forward)})
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    logged = [row["epoch"] for row in training_rows(run_dir)]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= 15  # past the checkpoint of update 15
    resumed = train(load_resume_config(run_dir, None), run_dir, quiet=True, resume=True)
    # Every epoch is logged once, and the rows (the noise measured and averaged across epochs, and the sharpness
    # every 5 epochs, included) and weights are those of the run that was never killed, to the bit: the killed
    # processes' updates (Grappler on) round as this process's (Grappler off), or their rows would differ too.
    assert training_rows(run_dir) == training_rows(tmp_path / "reference")
    assert sum("sharpness" in row for row in training_rows(run_dir)) == 4
    for mine, theirs in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.slow
@pytest.mark.subprocess
def test_lbfgs_killed_in_a_line_search_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    # Each evaluation is two forward passes (inference mode, which the hook counts too); a checkpoint every 3
    # iterations (epochs). No tolerance stops it early.
    path = write_config(
        tmp_path / "kill.yaml",
        seed=4,
        data={"name": "synthetic", "samples": 30, "shape": [4], "classes": 3, "validation_split": 0.0},
        model={"name": "tests.hook_models:mlp", "hidden": [8], "every_pass": True},
        training={"epochs": 6, "batch_size": "full", "subdivisions": 2},
        optimizer={"name": "lbfgs", "tolerance_grad": 0.0, "tolerance_change": 0.0},
        output={"tensorboard": False, "checkpoint_every_updates": 3},
    )
    hook_models.reset()
    reference = train(load_config(path), tmp_path / "reference", quiet=True)
    evaluations = [int(row["evaluations"]) for row in training_rows(tmp_path / "reference")]
    # The passes before training (the checks of the model and loss on two samples) count too.
    before = hook_models.HOOKS.forwards - 2 * sum(evaluations)
    # Killed in iteration 5's last evaluation: a trial point of its line search, after the checkpoint of iteration 3.
    forward = before + 2 * sum(evaluations[:5]) - 1
    run_dir = tmp_path / "run"
    repository = Path(__file__).parent.parent
    killed = run_cli(
        "train", str(path), "--run-dir", str(run_dir), cwd=repository,
        env={"ACCUMRUN_TEST_KILL_AT_FORWARD": str(forward)},
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [row["epoch"] for row in training_rows(run_dir)] == [1, 2, 3, 4]
    resumed = train(load_resume_config(run_dir, None), run_dir, quiet=True, resume=True)
    assert training_rows(run_dir) == training_rows(tmp_path / "reference")
    for mine, theirs in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
