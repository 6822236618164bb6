"""Several updates per compiled call (``training.updates_per_call``) give the run of one update per call, bit for bit:
the same weights and the same rows, with full batches, uneven last batches, the controls, skipped non-finite batches
and BatchNorm; and a call ends wherever the host is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.core.updates import UpdateLoop
from accumrun.errors import Interrupted, TrainingDiverged
from accumrun.training.cadence import Cadence
from tests.helpers import signal_after_batch, write_config
from tests.test_resume import TIMING_KEYS, nan_sample_config


def record_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of updates of every compiled call from now on."""
    sizes: list[int] = []
    call = UpdateLoop.__call__

    def recorded(self: UpdateLoop, rows: np.ndarray, *args: Any) -> Any:
        sizes.append(len(rows))
        return call(self, rows, *args)

    monkeypatch.setattr(UpdateLoop, "__call__", recorded)
    return sizes


def fit(path: Path, run_dir: Path, updates_per_call: int | str) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """Train the config at ``path`` with ``updates_per_call``; its final weights and its rows less timings."""
    config = load_config(path, [f"training.updates_per_call={updates_per_call}"])
    result = train(config, run_dir, quiet=True)
    rows = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in result.metrics]
    return [v.numpy() for v in result.model.variables], rows


Run = tuple[list[np.ndarray], list[dict[str, Any]]]


def assert_same_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, several: int | str, one: Run | None = None
) -> list[int]:
    """Assert that ``several`` updates per call train as one per call does (``one``, trained here unless given);
    return the sizes of its calls."""
    weights, rows = one if one is not None else fit(path, tmp_path / "one", 1)
    sizes = record_calls(monkeypatch)
    several_weights, several_rows = fit(path, tmp_path / "several", several)
    assert several_rows == rows
    for mine, theirs in zip(several_weights, weights, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    return sizes


def config(tmp_path: Path, **sections: Any) -> Path:
    """An MLP on 40 synthetic samples (36 to train), without TensorBoard; ``sections`` override."""
    base: dict[str, Any] = {
        "seed": 2,
        "data": {"name": "synthetic", "samples": 40, "shape": [5], "classes": 3, "validation_split": 0.1},
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 6, "batch_size": "full", "subdivisions": 3},
        "optimizer": {"name": "adam", "learning_rate": 0.02},
        "output": {"tensorboard": False},
    }
    for key, value in sections.items():
        base[key] = {**base[key], **value}
    return write_config(tmp_path / "config.yaml", **base)


@pytest.fixture(scope="module")
def twelve_epochs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """12 epochs of one full batch each, without validation, trained once for the tests that read them: with one
    update per call (``one``, in ``folder/one``) and with 5 (``several``, in ``folder/several``, its calls'
    sizes in ``sizes``)."""
    folder = tmp_path_factory.mktemp("twelve-epochs")
    path = config(folder, data={"validation_split": 0.0}, training={"epochs": 12})
    one = fit(path, folder / "one", 1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        sizes = record_calls(monkeypatch)
        several = fit(path, folder / "several", 5)
    return {"folder": folder, "one": one, "several": several, "sizes": sizes}


@pytest.mark.slow
def test_full_batch_runs_many_epochs_per_call(twelve_epochs: dict[str, Any]) -> None:
    (weights, rows), (several_weights, several_rows) = twelve_epochs["one"], twelve_epochs["several"]
    assert several_rows == rows
    for mine, theirs in zip(several_weights, weights, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # 12 epochs of one update each: 5 + 5 + 2, across the ends of epochs.
    assert twelve_epochs["sizes"] == [5, 5, 2]


@pytest.mark.slow
def test_uneven_last_batches_run_in_calls_of_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 36 samples in batches of 8: 8, 8, 8, 8 and 4, each cut in 3 (3-3-2 and 2-1-1); validation every 2nd epoch.
    path = config(tmp_path, training={"batch_size": 8, "epochs": 4, "validate_every": 2})
    sizes = assert_same_run(path, tmp_path, monkeypatch, 3)
    # Epoch 1 runs its four full batches (3 + 1) and its short one; epoch 2 ends the call (it validates).
    assert sizes[:4] == [3, 1, 1, 3]


@pytest.mark.slow
def test_auto_grows_the_calls_and_equals_one_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twelve_epochs: dict[str, Any]
) -> None:
    # The twelve epochs' config, against its run with one update per call.
    path = config(tmp_path, data={"validation_split": 0.0}, training={"epochs": 12})
    sizes = assert_same_run(path, tmp_path, monkeypatch, "auto", twelve_epochs["one"])
    # The first call traces and the second is timed, one update each; then a call takes what is left (calls of 4
    # updates or more: 0.5 s of work at up to 0.125 s an update).
    assert sizes[:2] == [1, 1] and len(sizes) <= 5 and sum(sizes) == 12


@pytest.mark.slow
def test_early_stopping_and_plateau_decide_as_with_one_update_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config(
        tmp_path,
        training={"epochs": 40, "batch_size": 12, "validate_every": 2, "early_stopping": {"patience": 2}},
        optimizer={"learning_rate": 0.5, "reduce_on_plateau": {"patience": 1, "factor": 0.5}},
    )
    one = fit(path, tmp_path / "reference", 1)
    rows = one[1]
    assert rows[-1].get("stopped") and len(rows) < 40, "the config must stop early to test the stop"
    assert len({row["learning_rate"] for row in rows}) > 1, "the config must lower the rate to test it"
    # Rows of epochs that do not validate hold no val_ figures.
    assert "val_loss" not in rows[0] and "val_loss" in rows[1]
    sizes = assert_same_run(path, tmp_path, monkeypatch, 7, one)
    assert max(sizes) == 6  # two epochs of three batches of 12: a call ends where an epoch validates


@pytest.mark.slow
def test_skip_batch_counts_the_same_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = nan_sample_config(tmp_path, monkeypatch, "skip_batch")
    sizes = assert_same_run(path, tmp_path, monkeypatch, 4)
    assert max(sizes) > 1


def test_stop_on_non_finite_stops_at_the_same_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = nan_sample_config(tmp_path, monkeypatch, "stop")
    sizes = record_calls(monkeypatch)
    with pytest.raises(TrainingDiverged, match="the loss is nan at epoch 1, batch 2; that update was not applied"):
        train(load_config(path, ["training.updates_per_call=5"]), tmp_path / "run", quiet=True)
    assert sizes == [2]  # the batches 10 and 10: the call ran the first, and stopped at the second


@pytest.mark.slow
def test_batch_norm_precise_equals_one_update_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(
        tmp_path / "config.yaml",
        data={"name": "digits", "validation_split": 0.0},
        model={"name": "darknet_cnn", "filters": [4, 8], "strides": [2, 2]},
        training={"epochs": 2, "batch_size": 300, "subdivisions": 4, "batch_norm": "precise"},
        output={"tensorboard": False},
    )
    # 1,797 samples in batches of 300: five full ones and one of 297.
    sizes = assert_same_run(path, tmp_path, monkeypatch, "auto")
    assert max(sizes) > 1


def cadence(**changes: Any) -> Cadence:
    """5 epochs of 4 batches, validating after every 3rd and the last; ``changes`` override."""
    settings: dict[str, Any] = {
        "epochs": 5,
        "batches_per_epoch": 4,
        "validate_every": 3,
        "validates": True,
        "every_epoch_end": False,
        "checkpoint_seconds": 600.0,
        "checkpoint_every_updates": None,
        "updates_per_call": None,
    }
    return Cadence(**{**settings, **changes})


@pytest.mark.parametrize(
    ("changes", "position", "expected"),
    [
        ({}, (0, 0, 0), 12),  # validates after epoch 3 (0-based 2): 3 epochs of 4 batches
        ({}, (2, 1, 0), 3),
        ({}, (3, 0, 0), 8),  # next: epoch 5 (0-based 4), the last
        ({"validates": False}, (0, 0, 0), 20),  # nothing but the end of the run
        ({"every_epoch_end": True}, (1, 1, 0), 3),
        ({"checkpoint_every_updates": 7}, (0, 0, 5), 2),  # a checkpoint after the 7th update
        ({"checkpoint_every_updates": 7}, (0, 0, 7), 7),
    ],
)
def test_a_call_ends_where_the_host_is_needed(
    changes: dict[str, Any], position: tuple[int, int, int], expected: int
) -> None:
    assert cadence(**changes).updates_until_host(*position) == expected


def test_auto_sizes_calls_by_time_within_what_a_call_holds() -> None:
    auto = cadence()
    assert [auto.validates_after(epoch) for epoch in range(5)] == [False, False, True, False, True]
    assert auto.wanted(None) == 1 and auto.wanted(0.5 / 3) == 3
    assert cadence(updates_per_call=4).wanted(0.5 / 3) == 4
    assert auto.call_size(3, 2, 100, 10) == 2
    assert auto.call_size(10**9, 10**9, 10**9, 2**20) == 16  # at most 2**24 rows per call


@pytest.mark.slow
def test_a_signal_stops_after_the_call_under_way_and_the_run_resumes_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twelve_epochs: dict[str, Any]
) -> None:
    path = config(tmp_path, data={"validation_split": 0.0}, training={"epochs": 12, "updates_per_call": 5})
    reference, _ = twelve_epochs["several"]  # this config's run, uninterrupted
    # Calls of epochs 1-5, 6-10 and 11-12: a Ctrl-C during epoch 6 stops after epoch 10.
    signal_after_batch(monkeypatch, 6, one_update_per_call=False)
    with pytest.raises(Interrupted, match="SIGINT at epoch 10, batch 1; saved"):
        train(load_config(path), tmp_path / "run", quiet=True)
    monkeypatch.undo()
    resumed = train(load_config(path), tmp_path / "run", quiet=True, resume=True)
    for mine, theirs in zip(resumed.model.variables, reference, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs)
    assert [row["epoch"] for row in resumed.metrics] == list(range(1, 13))


@pytest.mark.slow
def test_checkpoints_by_time_and_at_the_end(tmp_path: Path, twelve_epochs: dict[str, Any]) -> None:
    # 10 minutes never pass here: only the end of the run checkpoints (the 12 epochs' run, one update per call).
    assert [p.name for p in sorted((twelve_epochs["folder"] / "one" / "checkpoints").glob("*.npz"))] == [
        "ckpt-epoch00012-batch0000001.npz"
    ]
    path = config(tmp_path, data={"validation_split": 0.0}, training={"epochs": 5})
    train(
        load_config(path, ["output.checkpoint_every=null", "output.keep_checkpoints=9"]), tmp_path / "ends", quiet=True
    )
    assert len(list((tmp_path / "ends" / "checkpoints").glob("*.npz"))) == 5
    # A duration that has always passed: a checkpoint after every call (one update each until one is timed).
    short = ["output.checkpoint_every=0.001s", "output.keep_checkpoints=9", "training.updates_per_call=2"]
    train(load_config(path, short), tmp_path / "often", quiet=True)
    assert [p.name[:-4] for p in sorted((tmp_path / "often" / "checkpoints").glob("*.npz"))] == [
        f"ckpt-epoch{epoch:05d}-batch0000001" for epoch in (2, 4, 5)
    ]


def test_checkpoint_every_takes_durations_only(tmp_path: Path) -> None:
    from accumrun.errors import ConfigError

    with pytest.raises(ConfigError, match="output.checkpoint_every: must be a duration such as 90s, 10min or 1h"):
        load_config(config(tmp_path), ["output.checkpoint_every=10"])
    assert load_config(config(tmp_path), ["output.checkpoint_every=1.5h"]).output.checkpoint_seconds == 5400
