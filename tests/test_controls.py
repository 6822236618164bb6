"""Early stopping, keep_best and reduce-on-plateau: decided on scripted metric sequences, then in real runs that
are interrupted and resumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accumrun import load_config, train
from accumrun.config.loading import load_resume_config
from accumrun.errors import ConfigError, ConfigProblems, Interrupted
from accumrun.rundir.metrics import EpochRow
from accumrun.training.controls import Controls
from tests.helpers import signal_after_batch, tiny_config


def controls(tmp_path: Path, **sections: Any) -> Controls:
    config = load_config(tiny_config(tmp_path, **sections))
    return Controls(config, ["loss", "accuracy", "val_loss", "val_accuracy"])


def logged(monitor: str, value: float, rate: float) -> EpochRow:
    """An epoch's row that logs ``value`` under ``monitor``, trained at ``rate``."""
    return EpochRow(epoch=1, loss=1.0, figures={monitor: value}, learning_rate=rate)


def decide(controls: Controls, values: list[float], monitor: str = "val_loss", rate: float = 0.01) -> list[Any]:
    decisions = []
    for value in values:
        decision = controls.after_epoch(logged(monitor, value, rate), rate)
        rate = decision.learning_rate or rate
        decisions.append(decision)
    return decisions


def test_early_stopping_stops_after_patience_epochs_without_improvement(tmp_path: Path) -> None:
    stopping = controls(
        tmp_path, training={"early_stopping": {"monitor": "val_loss", "patience": 2, "min_delta": 0.05}}
    )
    # Epoch 3 improves by less than min_delta; epochs 3 and 4 are the two epochs without improvement.
    stops = [d.stop for d in decide(stopping, [1.0, 0.8, 0.79, 0.9, 0.5])]
    assert stops[:3] == [None, None, None]
    assert stops[3] == "early stopping: val_loss has not improved for 2 epochs (best 0.8)"


def test_early_stopping_maximizes_accuracy_and_honours_an_explicit_mode(tmp_path: Path) -> None:
    accuracy = controls(tmp_path, training={"early_stopping": {"monitor": "val_accuracy", "patience": 1}})
    assert [d.stop is not None for d in decide(accuracy, [0.5, 0.6, 0.55], "val_accuracy")] == [False, False, True]
    inverted = controls(
        tmp_path, training={"early_stopping": {"monitor": "val_accuracy", "patience": 1, "mode": "min"}}
    )
    assert [d.stop is not None for d in decide(inverted, [0.5, 0.6], "val_accuracy")] == [False, True]


def test_keep_best_marks_the_best_epochs(tmp_path: Path) -> None:
    best = controls(tmp_path, output={"keep_best": "val_loss"})
    assert [d.keep_best for d in decide(best, [1.0, 0.7, 0.9, 0.6, 0.6])] == [True, True, False, True, False]
    by_accuracy = controls(tmp_path, output={"keep_best": {"monitor": "val_accuracy"}})
    assert [d.keep_best for d in decide(by_accuracy, [0.5, 0.4, 0.7], "val_accuracy")] == [True, False, True]


def test_reduce_on_plateau_lowers_the_rate_after_patience_then_cools_down(tmp_path: Path) -> None:
    plateau = {"monitor": "val_loss", "factor": 0.5, "patience": 2, "cooldown": 1, "min_lr": 0.002}
    reducing = controls(tmp_path, optimizer={"reduce_on_plateau": plateau})
    rates = [d.learning_rate for d in decide(reducing, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])]
    # 2 epochs without improvement -> 0.005; a cooldown epoch; 2 more -> 0.0025; cooldown; 2 more -> the floor.
    assert rates == [None, None, 0.005, None, None, 0.0025, None, None, 0.002]


def test_replaying_the_rows_gives_the_state_an_uninterrupted_run_has(tmp_path: Path) -> None:
    sections = {
        "training": {"early_stopping": {"patience": 3}},
        "optimizer": {"reduce_on_plateau": {"patience": 1}},
        "output": {"keep_best": "val_loss"},
    }
    values, rate = [1.0, 0.9, 0.95, 0.97, 0.96, 0.99], 0.01
    whole = decide(controls(tmp_path, **sections), values)
    rows, rates = [], []
    for value, decision in zip(values, whole, strict=True):
        rows.append(logged("val_loss", value, rate))
        rates.append(rate)
        rate = decision.learning_rate or rate
    for cut in range(1, len(values)):
        resumed = controls(tmp_path, **sections)
        resumed.replay(rows[:cut])
        later = [resumed.after_epoch(row, row.learning_rate) for row in rows[cut:]]
        assert later == whole[cut:]


def test_a_monitor_that_is_not_logged_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"output\.keep_best: is not a logged figure; choose one of accuracy, loss, "):
        controls(tmp_path, output={"keep_best": "val_acc"})


def test_reduce_on_plateau_with_a_schedule_is_refused(tmp_path: Path) -> None:
    schedule = {"name": "cosine_decay", "initial_learning_rate": 0.01, "decay_steps": 10}
    path = tiny_config(tmp_path, optimizer={"learning_rate": schedule, "reduce_on_plateau": {"patience": 1}})
    with pytest.raises(ConfigProblems, match=r"optimizer\.reduce_on_plateau: cannot change a learning-rate schedule"):
        load_config(path)


# --- in real runs ------------------------------------------------------------------------------------------------

CONTROLLED = {
    # min_delta 10 on the training loss: no epoch after the first counts as an improvement, so the rate halves
    # after epoch 2 and training stops after epoch 4; val_loss picks the best model. 22 samples: 20 to train on,
    # two whole batches of 10 per epoch, so each of the four runs traces the step for one batch size alone.
    "data": {"samples": 22},
    "training": {"epochs": 6, "early_stopping": {"monitor": "loss", "patience": 3, "min_delta": 10.0}},
    "optimizer": {"reduce_on_plateau": {"monitor": "loss", "patience": 1, "min_delta": 10.0, "cooldown": 1}},
    "output": {"keep_best": "val_loss", "tensorboard": False},
}


@pytest.mark.slow
def test_a_controlled_run_stops_lowers_the_rate_and_keeps_the_best_model_and_resumes_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import keras

    path = tiny_config(tmp_path, **CONTROLLED)
    reference = train(load_config(path), tmp_path / "reference", quiet=True)
    rows = reference.metrics
    assert [row["epoch"] for row in rows] == [1, 2, 3, 4]
    assert "stopped" not in rows[2] and rows[3]["stopped"].startswith("early stopping: loss has not improved for 3")
    status = json.loads((tmp_path / "reference" / "run.json").read_text())
    assert status["status"] == "completed" and status["reason"] == rows[3]["stopped"]
    # The rate halves after epoch 2 (patience 1), waits out the cooldown in epoch 3, halves again after epoch 4.
    assert [row["learning_rate"] for row in rows] == pytest.approx([0.01, 0.01, 0.005, 0.005])
    # The first update at the lower rate is update 5 (2 per epoch): the change applies from the next epoch.
    assert rows[1]["optimizer_steps"] == 4
    best_epoch = min(rows, key=lambda row: row["val_loss"])["epoch"]
    best = keras.models.load_model(tmp_path / "reference" / "model.best.keras")
    shorter = train(load_config(path, [f"training.epochs={best_epoch}"]), tmp_path / "shorter", quiet=True)
    for mine, theirs in zip(best.get_weights(), shorter.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)

    signal_after_batch(monkeypatch, 5)  # the first of epoch 3's two batches: a stop in the middle of an epoch
    with pytest.raises(Interrupted):
        train(load_config(path), tmp_path / "run", quiet=True)
    monkeypatch.undo()
    resumed = train(load_resume_config(tmp_path / "run", None), tmp_path / "run", quiet=True, resume=True)
    assert [_untimed(row) for row in resumed.metrics] == [_untimed(row) for row in rows]
    again = keras.models.load_model(tmp_path / "run" / "model.best.keras")
    for mine, theirs in zip(again.get_weights(), best.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # Stopped early, the run is over: more epochs would not train past the decision.
    longer = load_resume_config(tmp_path / "run", None, ["training.epochs=8"])
    with pytest.raises(ConfigError, match=r"resume: the run ended by early stopping"):
        train(longer, tmp_path / "run", quiet=True, resume=True)


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    """A row without what depends on the clock or the process: the rest must repeat exactly."""
    return {k: v for k, v in row.items() if k not in ("seconds", "samples_per_second") and not k.startswith("peak_")}
