"""The epoch loop, in process: logged numbers, the run directory, refusals before anything is written."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.config.schema import Config
from accumrun.core.losses import sparse_categorical_crossentropy
from accumrun.data.dataset import load_dataset
from accumrun.errors import ConfigError, TrainingDiverged
from accumrun.kinds import BatchNormMode, RunState
from accumrun.models.builders import build_model
from accumrun.rundir.metrics import EpochRow
from accumrun.rundir.status import AutoNote, BatchNormNote, RunRecord
from accumrun.training.runner import RunResult
from tests.helpers import invoke, tiny_config

DESIGN_KEYS = {
    "epoch",
    "loss",
    "accuracy",
    "val_loss",
    "val_accuracy",
    "seconds",
    "samples_per_second",
    "batch_size",
    "subdivisions",
    "sub_batch_size",
    "optimizer_steps",
}


@dataclass(frozen=True)
class Trained:
    """A run that several tests read: its config and its result (``result.run_dir`` is its folder)."""

    config: Config
    result: RunResult


def _trained(tmp_path_factory: pytest.TempPathFactory, overrides: list[str]) -> Trained:
    folder = tmp_path_factory.mktemp("run")
    config = load_config(tiny_config(folder), overrides)
    return Trained(config, train(config, folder / "run", quiet=True))


@pytest.fixture(scope="module")
def subdivided(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The tiny config as it is (subdivisions 3), with TensorBoard's per-update loss every 2 updates."""
    return _trained(tmp_path_factory, ["output.log_every_updates=2"])


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The tiny config with subdivisions 1 and TensorBoard off (which changes nothing else)."""
    return _trained(tmp_path_factory, ["training.subdivisions=1", "output.tensorboard=false"])


@pytest.mark.slow
def test_run_directory_holds_config_metrics_and_a_loadable_model(subdivided: Trained) -> None:
    config, result = subdivided.config, subdivided.result
    run_dir = result.run_dir
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert all(set(row) >= DESIGN_KEYS for row in rows)
    # 26 samples, 10% validation -> 23 training samples in batches of 10: 3 updates per epoch.
    assert [row["optimizer_steps"] for row in rows] == [3, 6]
    assert rows[0]["sub_batch_size"] == 4 and rows[0]["subdivisions"] == 3 and rows[0]["batch_size"] == 10

    # config.yaml is the config, with what it left to accumrun resolved.
    saved = load_config(run_dir / "config.yaml")
    assert (saved.data.task, saved.data.rescale, saved.data.feed) == ("classification", 1.0, "batch")
    assert (saved.loss.name, saved.loss.from_logits, saved.metrics) == (
        "sparse_categorical_crossentropy",
        True,
        ["accuracy"],
    )
    settled = {"task": "classification", "rescale": 1.0, "feed": "batch"}
    resolved = {"data": config.data.model_copy(update=settled), "loss": saved.loss}
    assert saved == config.model_copy(update={**resolved, "metrics": ["accuracy"]})
    status = json.loads((run_dir / "run.json").read_text())
    assert status["status"] == "completed" and status["ended"] and status["tensorflow_version"] == tf.__version__
    loaded = keras.models.load_model(run_dir / "model.keras")
    probe = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(loaded.predict(probe, verbose=0), result.model.predict(probe, verbose=0), atol=1e-6)


@pytest.mark.slow
def test_subdivisions_on_and_off_give_the_same_run_for_a_model_without_batchnorm(
    subdivided: Trained, plain: Trained
) -> None:
    on, off = subdivided.result, plain.result
    for row_on, row_off in zip(on.metrics, off.metrics, strict=True):
        assert row_on["loss"] == pytest.approx(row_off["loss"], abs=1e-6)
        assert row_on["val_loss"] == pytest.approx(row_off["val_loss"], abs=1e-6)
        assert row_on["optimizer_steps"] == row_off["optimizer_steps"]
    for a, b in zip(on.model.get_weights(), off.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_epoch_loss_is_the_mean_over_samples_not_over_batches(tmp_path: Path) -> None:
    # With a negligible learning rate the weights stay put, so the logged loss must equal the initial model's
    # mean loss over the 23 training samples. A mean of the three batch means (10, 10, 3) would differ.
    path = tiny_config(
        tmp_path,
        optimizer={"name": "sgd", "learning_rate": 1e-20},
        training={"epochs": 1},
        output={"tensorboard": False},
    )
    config = load_config(path)
    result = train(config, tmp_path / "run", quiet=True)

    dataset = load_dataset(config.data, config.seed)
    keras.utils.set_random_seed(config.seed)
    initial = build_model(config.model, dataset.sample_shape, dataset.classes)
    per_sample = sparse_categorical_crossentropy(tf.constant(dataset.train.y), initial(dataset.train.x)).numpy()
    assert result.metrics[0]["loss"] == pytest.approx(float(per_sample.mean()), rel=1e-5)
    batch_means = [per_sample[i : i + 10].mean() for i in range(0, 23, 10)]
    assert abs(np.mean(batch_means) - per_sample.mean()) > 1e-4  # the distinction is visible on this data


@pytest.mark.slow
def test_full_batch_makes_one_update_per_epoch(tmp_path: Path) -> None:
    config = load_config(tiny_config(tmp_path), ["training.batch_size=full", "output.tensorboard=false"])
    result = train(config, tmp_path / "run", quiet=True)
    assert [row["optimizer_steps"] for row in result.metrics] == [1, 2]
    assert result.metrics[0]["batch_size"] == 23 and result.metrics[0]["sub_batch_size"] == 8


def test_the_startup_summary_says_how_many_samples_full_is(tmp_path: Path) -> None:
    checked = invoke("check", str(tiny_config(tmp_path)), "--batch-size", "full")
    assert checked.returncode == 0, checked.stderr
    assert (
        "batch full = all 23 training samples (3 held out for validation): batch 23 = 3 sub-batches" in checked.stdout
    )


def test_batch_larger_than_the_training_set_is_refused_before_writing(tmp_path: Path) -> None:
    config = load_config(tiny_config(tmp_path), ["training.batch_size=24"])
    with pytest.raises(ConfigError, match=r"training.batch_size: is larger than the 23 training samples.*full"):
        train(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_existing_run_directory_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("precious\n")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        train(load_config(tiny_config(tmp_path)), tmp_path / "run", quiet=True)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "precious\n"


def test_divergence_stops_training_naming_epoch_and_batch(tmp_path: Path) -> None:
    path = tiny_config(tmp_path, optimizer={"name": "sgd", "learning_rate": 1e30}, output={"tensorboard": False})
    with pytest.raises(
        TrainingDiverged, match=r"the loss is (nan|inf) at epoch \d+, batch \d+; that update was not applied"
    ):
        train(load_config(path), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "model.keras").exists()
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "failed" and "training diverged" in status["reason"]


def _tensorboard_tags(run_dir: Path) -> dict[str, list[int]]:
    """Tag -> steps of every scalar in the run's TensorBoard event files."""
    steps: dict[str, list[int]] = {}
    for events in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


@pytest.mark.slow
def test_tensorboard_gets_epoch_scalars_and_every_nth_update(subdivided: Trained) -> None:
    tags = _tensorboard_tags(subdivided.result.run_dir)
    assert tags["epoch/loss"] == [1, 2] and tags["epoch/val_loss"] == [1, 2]
    assert tags["update/loss"] == [2, 4, 6]  # 6 updates in all, one point every 2


@pytest.mark.slow
def test_tensorboard_can_be_switched_off(plain: Trained) -> None:
    assert not (plain.result.run_dir / "tensorboard").exists()


def test_rows_and_run_records_round_trip_through_their_reader_and_writer(tmp_path: Path) -> None:
    row = EpochRow(
        epoch=2,
        loss=0.5,
        figures={"accuracy": 0.75, "val_loss": 0.625, "val_accuracy": 0.5},
        seconds=1.5,
        samples_per_second=20.0,
        batch_size=10,
        subdivisions=3,
        sub_batch_size=4,
        optimizer_steps=6,
        learning_rate=0.01,
        peak_rss_mib=100.0,
        stopped="early stopping: val_loss has not improved for 1 epochs (best 0.6)",
    )
    written = row.to_json()
    assert list(written)[:5] == ["epoch", "loss", "accuracy", "val_loss", "val_accuracy"]
    # Keys that do not apply (no loss scale, no GPU) are left out, not written as null.
    assert "loss_scale_skips" not in written and "peak_device_mib" not in written
    assert EpochRow.from_json(json.loads(json.dumps(written))) == row

    record = RunRecord(
        status=RunState.COMPLETED,
        started="2026-01-01T00:00:00",
        ended="2026-01-01T00:01:00",
        resumed=("2026-01-01T00:00:30",),
        tensorflow_version="2.x",
        batch_norm=BatchNormNote(2, BatchNormMode.FROZEN),
        subdivisions_auto=AutoNote(4, (1, 2, 4)),
    )
    record.write(tmp_path)
    assert RunRecord.read(tmp_path) == record
    assert json.loads((tmp_path / "run.json").read_text())["batch_norm"] == {"layers": 2, "mode": "frozen"}
    assert RunRecord.read(tmp_path / "missing") is None


@pytest.mark.subprocess
def test_reading_a_run_folder_loads_no_tensorflow() -> None:
    check = (
        "import sys, accumrun.rundir.layout, accumrun.rundir.status, accumrun.rundir.metrics; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_the_logged_loss_includes_regularization_as_keras_logs_it(tmp_path: Path) -> None:
    """A model with an L2 kernel regularizer: the logged loss is the objective minimized, what Keras' evaluate
    reports for the same weights, not the data term alone; so is val_loss."""
    import keras

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(30, 5)).astype(np.float32), rng.integers(0, 3, 30)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    keras.utils.set_random_seed(1)
    regularized = keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(0.5))
    model = keras.Sequential([keras.Input((5,)), regularized])
    model.save(tmp_path / "user.keras")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    config = {
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "validation_split": 0.2, "shuffle": False},
        "model": {"name": "saved", "path": str(tmp_path / "user.keras")},
        "training": {"epochs": 1, "batch_size": "full", "subdivisions": 3},
        "optimizer": {"name": "sgd", "learning_rate": 0.1},
        "output": {"tensorboard": False},
    }
    result = train(config, tmp_path / "run", quiet=True)
    # One update: the epoch's loss is taken at the initial weights, val_loss at the updated ones.
    train_x, train_y, val_x, val_y = x[:24], y[:24], x[24:], y[24:]
    objective = model.evaluate(train_x, train_y, verbose=0, return_dict=True)["loss"]
    data_term = float(
        keras.losses.sparse_categorical_crossentropy(train_y, model(train_x), from_logits=True).numpy().mean()
    )
    row = result.metrics[0]
    assert row["loss"] == pytest.approx(objective, abs=1e-5) and abs(objective - data_term) > 0.05
    assert row["val_loss"] == pytest.approx(
        result.model.evaluate(val_x, val_y, verbose=0, return_dict=True)["loss"], abs=1e-5
    )


@pytest.mark.parametrize("remat", ["none", "layers"])
def test_a_finished_run_lets_go_of_the_graphs_it_traced(tmp_path: Path, remat: str) -> None:
    """TensorFlow's gradient registry keeps the graph of every custom gradient traced in one (tensorflow#97697):
    the step's all-reduce, and each recomputed layer under remat. A process that trains again must not still hold
    the first run's step."""

    def graphs() -> int:
        gc.collect()
        return sum(isinstance(held, FuncGraph) for held in gc.get_objects())

    before = graphs()
    train(tiny_config(tmp_path, training={"remat": remat}), tmp_path / "run", quiet=True)
    assert graphs() <= before
