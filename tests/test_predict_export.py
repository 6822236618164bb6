"""After training: the saved model is compiled and self-contained, ``predict`` labels new inputs with the names
of the classes, and ``export`` writes a SavedModel that serves the same probabilities."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import evaluate, export, load_config, predict, train
from accumrun.data.dataset import load_dataset
from accumrun.data.examples import SHAPES, write_image_folder
from accumrun.errors import ArgumentError, ConfigError, DataError
from accumrun.kinds import ModelFile
from accumrun.models.saving import write_keras_archive
from accumrun.rundir.layout import prepare_run_dir
from tests.helpers import invoke, write_config


def images_of(paths: list[str]) -> np.ndarray:
    """The files decoded independently of accumrun (PIL through Keras): raw uint8 pixels."""
    return np.stack([np.array(keras.utils.load_img(path)) for path in paths])


def test_the_archive_written_through_the_disk_is_the_one_keras_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same members (a learned vocabulary among the assets), and the same weights and optimizer state loaded,
    written to a path relative to the working folder."""
    lookup = keras.layers.StringLookup()
    lookup.adapt(np.array(["a", "b", "c", "a"]))
    inputs = keras.Input((1,), dtype="string")
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Embedding(5, 3)(lookup(inputs))))
    model.compile(optimizer="adam", loss="mse")
    model.fit(tf.constant([["a"], ["c"]]), np.ones((2, 1, 2)), verbose=0)
    monkeypatch.chdir(tmp_path)
    model.save("keras.keras")
    write_keras_archive(model, Path("ours.keras"))
    members = [sorted(zipfile.ZipFile(name).namelist()) for name in ("keras.keras", "ours.keras")]
    assert members[0] == members[1] and any(name.startswith("assets/") for name in members[1])
    assert not Path("ours.keras.folder").exists()
    loaded = keras.models.load_model("ours.keras")
    assert loaded.layers[1].get_vocabulary() == lookup.get_vocabulary()
    for saved, held in ((loaded.weights, model.weights), (loaded.optimizer.variables, model.optimizer.variables)):
        assert len(saved) == len(held) > 0
        for a, b in zip(saved, held, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-epoch MLP on an image folder of 30 shapes (10x10 PNGs), 9 held out for validation."""
    folder = tmp_path_factory.mktemp("image-run")
    images = write_image_folder(folder / "images", count=30, size=10, seed=4)
    path = write_config(
        folder / "images.yaml",
        seed=1,
        data={"name": "image_folder", "path": str(images), "image_size": [10, 10], "validation_split": 0.3},
        model={"name": "mlp", "hidden": [8]},
        training={"epochs": 2, "batch_size": 7, "subdivisions": 2},
        output={"tensorboard": False},
    )
    train(load_config(path), folder / "run", quiet=True)
    return folder / "run"


def validation_files(run_dir: Path) -> tuple[list[str], np.ndarray]:
    config = load_config(run_dir / "config.yaml")
    val = load_dataset(config.data, config.seed).val
    return [str(path) for path in val.paths], val.y  # type: ignore[union-attr]


@pytest.mark.slow
def test_predictions_name_the_folder_classes_and_agree_with_the_saved_model(image_run: Path, tmp_path: Path) -> None:
    labels = json.loads((image_run / "labels.json").read_text())
    assert labels == sorted(set(SHAPES))
    paths, y = validation_files(image_run)
    predictions = predict(image_run, paths, top_k=2)
    assert predictions.columns == ["input", "prediction", "top1_class", "top1_prob", "top2_class", "top2_prob"]
    assert [row[0] for row in predictions.rows] == paths
    # The probabilities are the saved model's softmax, on files decoded without accumrun.
    logits = keras.models.load_model(image_run / "model.keras").predict(images_of(paths), verbose=0)
    probabilities = tf.nn.softmax(logits).numpy()
    for row, p in zip(predictions.rows, probabilities, strict=True):
        assert row[1] == row[2] == labels[int(np.argmax(p))]
        assert row[3] == pytest.approx(float(p.max()), abs=1e-6)
        assert row[3] >= row[5]
    # Right or wrong as the run's own validation said.
    correct = np.mean([row[1] == labels[label] for row, label in zip(predictions.rows, y, strict=True)])
    last = json.loads((image_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert correct == pytest.approx(last["val_accuracy"], abs=1e-6)
    # The same images as an .npz give the same probabilities, rows named by index; CSV and JSON files agree.
    np.savez(tmp_path / "x.npz", x=images_of(paths))
    by_index = predict(image_run, [tmp_path / "x.npz"], top_k=2)
    assert [row[0] for row in by_index.rows] == [str(i) for i in range(len(paths))]
    assert [row[3] for row in by_index.rows] == pytest.approx([row[3] for row in predictions.rows], abs=1e-6)
    with predictions.write(tmp_path / "p.csv").open() as file:
        assert list(csv.reader(file))[1][:3] == [str(cell) for cell in predictions.rows[0][:3]]
    assert json.loads(predictions.write(tmp_path / "p.json").read_text()) == predictions.records()
    assert len(predict(image_run, [str(image_run.parent / "images")]).rows) == 30


@pytest.mark.slow
def test_the_export_serves_the_predicted_probabilities_with_class_names(image_run: Path, tmp_path: Path) -> None:
    paths, _ = validation_files(image_run)
    exported = export(image_run)
    assert exported.path == image_run / "export" / "savedmodel"
    assert exported.outputs == ["probabilities", "class_index", "class_name"]
    serve = tf.saved_model.load(str(exported.path)).signatures["serving_default"]
    served = serve(samples=tf.constant(images_of(paths)))
    predictions = predict(image_run, paths, top_k=1)
    assert [name.decode() for name in served["class_name"].numpy()] == [row[1] for row in predictions.rows]
    top = served["probabilities"].numpy().max(axis=1)
    assert top == pytest.approx([row[3] for row in predictions.rows], abs=1e-6)
    assert np.allclose(served["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(ConfigError, match=r"^output: exists; pass --overwrite to replace it"):
        export(image_run)
    # The command with --output and --overwrite, over a copy of that export with a stale file added: one export
    # shows both that --overwrite replaces what is there and that --output names where.
    out = shutil.copytree(exported.path, tmp_path / "served")
    (out / "stale").write_text("")
    written = invoke("export", str(image_run), "--output", str(out), "--overwrite")
    assert written.returncode == 0, written.stderr
    assert written.stdout.startswith(f"wrote {out}: serving_default(samples uint8 [None, 10, 10, 3]) -> ")
    assert out.is_dir() and not (out / "stale").exists()
    assert evaluate(image_run)["samples"] == len(paths)
    # A finished run's own additions do not stop --overwrite from replacing it.
    copy = shutil.copytree(image_run, tmp_path / "copy")
    assert {"export", "eval-val.json"} <= {path.name for path in copy.iterdir()}
    prepare_run_dir(copy, overwrite=True)
    assert not any(copy.iterdir())


@pytest.mark.slow
def test_a_regression_table_predicts_its_values_from_the_feature_columns(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3))
    target = x @ np.array([1.0, -2.0, 0.5]) + 0.1
    with (tmp_path / "table.csv").open("w") as file:
        rows = zip(x, target, strict=True)
        file.write(
            "code,a,b,c,target\n" + "".join(f"{100 + i},{r[0]},{r[1]},{r[2]},{t}\n" for i, (r, t) in enumerate(rows))
        )
    config = {
        "seed": 0,
        "data": {"name": "csv", "path": str(tmp_path / "table.csv"), "label": "target", "id": "code"},
        "model": {"name": "mlp", "hidden": [8]},
        "loss": {"name": "mean_squared_error"},
        # 36 rows to train on (4 held out) in three whole batches: the step is traced for one batch size alone.
        "training": {"epochs": 2, "batch_size": 12, "subdivisions": 3},
        "output": {"tensorboard": False},
    }
    train(config, tmp_path / "run", quiet=True)
    assert json.loads((tmp_path / "run" / "features.json").read_text()) == ["a", "b", "c"]
    # New rows: columns in another order, no target; the model takes them in the training order.
    # The id column is no feature (a number though it is), and names each row in predict's input column.
    with (tmp_path / "new.csv").open("w") as file:
        file.write("c,a,code,b\n" + "".join(f"{r[2]},{r[0]},{7 * i},{r[1]}\n" for i, r in enumerate(x[:5])))
    predictions = predict(tmp_path / "run", [tmp_path / "new.csv"])
    assert predictions.columns == ["input", "value_0"]
    assert [row[0] for row in predictions.rows] == ["0", "7", "14", "21", "28"]
    expected = keras.models.load_model(tmp_path / "run" / "model.keras").predict(x[:5].astype(np.float32), verbose=0)
    assert [row[1] for row in predictions.rows] == pytest.approx(expected[:, 0].tolist(), abs=1e-5)
    with (tmp_path / "short.csv").open("w") as file:
        file.write("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"short\.csv: lacks the feature columns \['c'\] that the run trained on"):
        predict(tmp_path / "run", [tmp_path / "short.csv"])
    # A cell that is not a number names the file once, then the row and the column.
    (tmp_path / "text.csv").write_text("a,b,c\n1,2,x\n")
    with pytest.raises(DataError) as bad_cell:
        predict(tmp_path / "run", [tmp_path / "text.csv"])
    assert bad_cell.value.message == f"{tmp_path / 'text.csv'}, row 2, column 'c': not a number (got 'x')"


def multi_label_run(folder: Path) -> Path:
    config = {
        "seed": 2,
        "data": {"name": "synthetic", "samples": 40, "shape": [5], "classes": 3, "task": "multi_label"},
        "model": {"name": "mlp", "hidden": [8]},
        "metrics": [{"name": "binary_accuracy", "threshold": 0.7}, "auc"],
        # 30 samples to train on (10 held out) in two whole batches: the step is traced for one batch size alone.
        "training": {"epochs": 2, "batch_size": 15, "subdivisions": 5},
        "output": {"tensorboard": False},
    }
    config["data"]["validation_split"] = 0.25
    train(config, folder / "run", quiet=True)
    return folder / "run"


@pytest.mark.slow
def test_a_multi_label_model_is_compiled_on_logits_and_predicts_every_label(tmp_path: Path) -> None:
    run_dir = multi_label_run(tmp_path)
    config = load_config(run_dir / "config.yaml")
    val = load_dataset(config.data, config.seed).val
    x, y = val.x, val.y  # type: ignore[union-attr]
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    # The model outputs logits; Keras' own threshold and AUC, set for logits, give the run's figures.
    scored = keras.models.load_model(run_dir / "model.keras").evaluate(x, y, verbose=0, return_dict=True)
    for name in ("loss", "binary_accuracy", "auc"):
        assert scored[name] == pytest.approx(last[f"val_{name}"], abs=1e-6)
    np.savez(tmp_path / "x.npz", x=x)
    predictions = predict(run_dir, [tmp_path / "x.npz"])
    assert predictions.columns == ["input", "prediction", "0", "1", "2"]
    for row in predictions.rows:
        assert row[1] == ";".join(label for label, p in zip("012", row[2:], strict=True) if float(p) >= 0.5)
    np.savez(tmp_path / "wide.npz", x=np.zeros((2, 6), np.float32))
    with pytest.raises(DataError, match=r"wide\.npz: x holds samples of shape \(6,\); the model takes \(5,\)"):
        predict(run_dir, [tmp_path / "wide.npz"])
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 5), np.float32))
    with pytest.raises(DataError, match=r"empty\.npz: x holds no samples"):
        predict(run_dir, [tmp_path / "empty.npz"])
    with pytest.raises(DataError, match=r"is an image or a folder; this run's model takes an \.npz with x"):
        predict(run_dir, [tmp_path])


def keras_only(script: str, **paths: Path) -> Any:
    """Run ``script`` in a fresh interpreter that imports Keras but never accumrun; return what it prints (JSON)."""
    prelude = "import json, sys, numpy as np, keras\n" + "".join(f"{k} = {str(v)!r}\n" for k, v in paths.items())
    epilogue = "\nassert not any(name.startswith('accumrun') for name in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + script + epilogue], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.subprocess
def test_keras_alone_evaluates_the_saved_model_on_raw_images_as_the_run_did(image_run: Path, tmp_path: Path) -> None:
    paths, y = validation_files(image_run)
    np.savez(tmp_path / "val.npz", x=images_of(paths), y=y)
    scored = keras_only(
        "data = np.load(val)\n"
        "model = keras.models.load_model(model_path)\n"
        "print(json.dumps(model.evaluate(data['x'], data['y'], verbose=0, return_dict=True)))",
        val=tmp_path / "val.npz",
        model_path=image_run / "model.keras",
    )
    last = json.loads((image_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert scored["loss"] == pytest.approx(last["val_loss"], abs=1e-6)
    assert scored["accuracy"] == pytest.approx(last["val_accuracy"], abs=1e-6)


@pytest.mark.slow
def test_the_model_is_chosen_by_enum_or_word_and_errors_name_the_api_arguments(image_run: Path) -> None:
    paths, _ = validation_files(image_run)
    by_word = predict(image_run, paths[:2], top_k=1, model="final")
    assert predict(image_run, paths[:2], top_k=1, model=ModelFile.FINAL) == by_word
    with pytest.raises(ConfigError, match=r"^model: the run has no model\.best\.keras; set output\.keep_best"):
        predict(image_run, paths[:2], model=ModelFile.BEST)
    with pytest.raises(ConfigError, match=r"^top_k: must be 1 to 3, the run's classes \(got 4\)"):
        predict(image_run, paths[:2], top_k=4)
    with pytest.raises(ArgumentError, match=r"^model: must be one of final, best \(got 'last'\)") as bad:
        export(image_run, model="last")
    assert bad.value.exit_code == 2


@pytest.mark.slow
def test_predict_and_export_commands_print_a_table_or_one_error(image_run: Path, tmp_path: Path) -> None:
    paths, _ = validation_files(image_run)
    table = invoke("predict", str(image_run), *paths[:3], "--top-k", "1")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["input", "prediction", "top1_class", "top1_prob"] and len(lines) == 4
    for count in (1, 2):
        out = tmp_path / f"{count}.csv"
        written = invoke("predict", str(image_run), *paths[:count], "--output", str(out))
        assert written.stdout == f"wrote {count} prediction{'s' if count > 1 else ''} to {out}\n", written.stderr
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 3, 3, 3), np.uint8))
    for args, code, message in (
        (("predict", str(image_run), str(tmp_path / "bad.npz")), 1, "x holds samples of shape (3, 3, 3)"),
        (("predict", str(image_run), paths[0], "--top-k", "0"), 2, "Invalid value for '--top-k'"),
        (("export", str(image_run), "--format", "onnx"), 2, "Invalid value for '--format'"),
        (("predict", str(image_run), paths[0], "--lines"), 1, "lines: reads lines of text files; this run's model"),
    ):
        result = invoke(*args)
        assert result.returncode == code and message in result.stderr and "Traceback" not in result.stderr
        assert sum(line.startswith("Error") for line in result.stderr.splitlines()) == 1
    # The export command's success line is checked in test_the_export_serves_the_predicted_probabilities_...
