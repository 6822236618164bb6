"""``accumrun evaluate``: a finished run's saved model, scored with the run's own loss and metrics, equals the
run's last validation row; the best model equals the best row; the command line refuses what is not there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from accumrun import evaluate, load_config, predict, train
from accumrun.data.examples import write_image_folder
from accumrun.errors import ArgumentError, ConfigError, DataError
from tests.helpers import invoke, tiny_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run of 3 epochs with validation, two metrics and keep_best. 33 samples: 3 held out, 30 to train on in
    three whole batches, so the step is traced for one batch size alone."""
    folder = tmp_path_factory.mktemp("evaluate")
    path = tiny_config(
        folder,
        data={"samples": 33},
        metrics=["accuracy", "auc"],
        training={"epochs": 3},
        output={"keep_best": "val_auc", "tensorboard": False},
    )
    train(load_config(path), folder / "run", quiet=True)
    return folder / "run"


def rows(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_final_model_scores_the_last_validation_row_and_the_best_the_best_row(finished: Path) -> None:
    last = rows(finished)[-1]
    result = evaluate(finished)
    assert result["split"] == "val" and result["model"] == "model.keras" and result["samples"] == 3
    # The run's validation pass, repeated: the same scorer's float32 operations on the same weights and batches, so
    # the same figures to the bit on any CPU.
    for name in ("loss", "accuracy", "auc"):
        assert result[name] == last[f"val_{name}"]
    assert json.loads((finished / "eval-val.json").read_text()) == result
    best_row = max(rows(finished), key=lambda row: row["val_auc"])
    best = evaluate(finished, model="best")
    assert best["auc"] == best_row["val_auc"]
    assert best["loss"] == best_row["val_loss"]
    assert (finished / "eval-best-val.json").is_file()
    assert evaluate(finished, "train")["samples"] == 30


@pytest.mark.slow
def test_a_model_trained_on_crops_scores_the_folder_as_validation_did(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "images", count=30, size=10, seed=4)
    config = {
        "seed": 1,
        "data": {"name": "image_folder", "path": str(folder), "image_size": [10, 10], "validation_split": 0.3},
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 2, "batch_size": 7, "subdivisions": 2},
        "output": {"tensorboard": False},
    }
    config["data"]["augment"] = [{"name": "random_crop", "height": 7, "width": 7}, {"name": "random_flip"}]
    result = train(config, tmp_path / "run", quiet=True)
    scored = evaluate(tmp_path / "run")
    # The saved model crops the centre as validation did: the same operations, the same figures to the bit.
    assert scored["loss"] == result.metrics[-1]["val_loss"]
    assert scored["accuracy"] == result.metrics[-1]["val_accuracy"]
    other = write_image_folder(tmp_path / "more", count=12, size=10, seed=5)
    assert evaluate(tmp_path / "run", data=other)["samples"] == 12
    # A folder without one of the run's classes numbers its own classes 0 and 1; they are scored as the run's
    # classes, so the accuracy is the share of the images that predict labels with their folder's name.
    shutil.rmtree(other / "bars")
    rows = predict(tmp_path / "run", [other]).records()
    right = sum(Path(str(row["input"])).parent.name == row["prediction"] for row in rows)
    assert evaluate(tmp_path / "run", data=other)["accuracy"] == pytest.approx(right / len(rows), abs=1e-6)
    (other / "stars").mkdir()
    shutil.copy(next((other / "disc").iterdir()), other / "stars" / "0.png")
    with pytest.raises(DataError, match=r"^--data: has labels the run was not trained on: \['stars'\]; the run's"):
        evaluate(tmp_path / "run", data=other)


@pytest.mark.slow
def test_what_is_not_there_is_refused(finished: Path, tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match=r": not a run folder \(no run\.json\)$"):
        evaluate(tmp_path)
    (tmp_path / "run.json").write_text('{"status": "interrupted", "started": ""}')
    with pytest.raises(ConfigError, match=r": not a finished run \(its run\.json says interrupted\)$"):
        evaluate(tmp_path)
    with pytest.raises(ConfigError, match=r"^split: data\.name: synthetic has no test split"):
        evaluate(finished, "test")


@pytest.mark.slow
def test_the_command_prints_one_line_or_one_error(finished: Path, tmp_path: Path) -> None:
    scored = invoke("evaluate", str(finished))
    assert scored.returncode == 0, scored.stderr
    assert scored.stdout.startswith("eval val (model.keras): loss ") and scored.stdout.count("\n") == 1
    for args, code, message in (
        ((str(tmp_path),), 2, f"Error: {tmp_path}: not a run folder (no run.json)"),
        ((str(finished), "--split", "test"), 1, "Error: split: data.name: synthetic has no test split"),
        ((str(finished), "--split", "dev"), 2, "Invalid value for '--split'"),
    ):
        result = invoke("evaluate", *args)
        assert result.returncode == code and message in result.stderr and "Traceback" not in result.stderr
