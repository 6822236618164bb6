"""Text classification: a folder of ``.txt`` files per class, byte or character tokens, a small pooled classifier
(the built-in ``transformer`` in the documented example); the folder streams (each file tokenized as the order
reaches it) to the ids and the weights of the same texts in memory; subdivided equals plain, predict reads text
files, and bad text is refused in one line. That a streamed run stopped mid-epoch resumes to the uninterrupted one
is tests/test_streaming.py's (the whole path once), and that a text folder's stream continues from a skip as it
would have run on is tests/test_sources.py's contract."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import export, load_config, predict, train
from accumrun.config.schema import data_config
from accumrun.data.dataset import load_dataset
from accumrun.data.examples import write_text_folder
from accumrun.data.feeder import Feeder
from accumrun.data.files import TextFiles
from accumrun.data.source import ArraySource
from accumrun.data.tokenizers.byte import ByteTokenizer
from accumrun.data.tokenizers.character import CharacterTokenizer
from accumrun.errors import DataError
from accumrun.kinds import CacheMode
from accumrun.training.runner import RunResult
from accumrun.training.setup import build_training
from tests.helpers import invoke, max_difference, write_config


def pooled_tokens(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """A classifier of the character tokenizer's 300 ids that traces in a fraction of the transformer's time (the
    transformer trains in the documented example and tests/test_text_tables.py): each token's embedding, dropped out
    per sample as the transformer's are, averaged."""
    ids = keras.Input(input_shape, dtype="int32")
    x = keras.layers.Dropout(0.1)(keras.layers.Embedding(300, 8)(ids))
    return keras.Model(ids, keras.layers.Dense(classes)(keras.layers.GlobalAveragePooling1D()(x)))


def text_config(tmp_path: Path, **training: Any) -> dict[str, Any]:
    """24 reviews (21 for training) of 1 to 24 words cut to 40 characters, in 3 batches of 7 (one batch shape, so
    the step is traced once a run), SGD, with the character tokenizer of 300 ids and :func:`pooled_tokens`."""
    return {
        "seed": 2,
        "data": {
            "name": "text_folder",
            "path": str(write_text_folder(tmp_path / "texts", 24)),
            "sequence_length": 40,
            "tokenizer": {"name": "character", "vocabulary_size": 300},
        },  # fmt: skip
        "model": {"name": "tests.test_text:pooled_tokens"},
        "training": {"epochs": 2, "batch_size": 7, "subdivisions": 1, **training},
        "optimizer": {"name": "sgd", "learning_rate": 0.3},
        "output": {"tensorboard": False},
    }


def test_a_text_folder_streams_the_ids_its_tokenizer_gives_on_the_host(tmp_path: Path) -> None:
    folder = write_text_folder(tmp_path / "texts", 6)
    extra = {"accents.txt": "réussi, très réussi", "emoji.txt": "dull 😀 film\r\nand \u0301 marks\x00",
             "long.txt": "tedious " * 40}  # fmt: skip
    for name, text in extra.items():
        (folder / "positive" / name).write_bytes(text.encode("utf-8"))
    paths = sorted(folder.glob("negative/*.txt")) + sorted(folder.glob("positive/*.txt"))
    texts = [path.read_bytes().decode("utf-8") for path in paths]
    for tokenizer, host in (({"name": "byte"}, ByteTokenizer()), ({"name": "character", "vocabulary_size": 300},
                            CharacterTokenizer(300))):  # fmt: skip
        config = data_config(name="text_folder", path=str(folder), tokenizer=tokenizer, sequence_length=24,
                             validation_split=0.0)  # fmt: skip
        split = load_dataset(config, seed=0).train
        assert isinstance(split, TextFiles) and [str(path) for path in paths] == list(split.paths)
        (x, y), *_ = Feeder(split, [split.size], seed=0, shuffle=False).epoch(0)
        np.testing.assert_array_equal(x.numpy(), host.encode(texts, 24))
        np.testing.assert_array_equal(y.numpy(), [0] * 3 + [1] * 6)
        # cache: memory tokenizes them at load, with the same reader: arrays of the same ids, held in memory.
        held = load_dataset(config.model_copy(update={"cache": CacheMode.MEMORY}), seed=0)
        arrays = held.train.in_memory
        assert isinstance(arrays, ArraySource) and not held.streamed
        np.testing.assert_array_equal(arrays.x, x.numpy())
        np.testing.assert_array_equal(arrays.y, y.numpy())

    # A file that goes missing after the listing is found when training reaches it, and named.
    split = load_dataset(config, seed=0).train
    paths[4].unlink()
    with pytest.raises(DataError, match=rf"data: {re.escape(str(paths[4]))} cannot be read as text \(.*\)"):
        list(Feeder(split, [4, 5], seed=0, shuffle=False).epoch(0))


class TextRuns(NamedTuple):
    """The streamed, subdivided run on the text folder and the plain run on the same texts held in memory."""

    config: dict[str, Any]
    initial: list[np.ndarray]
    streamed: RunResult
    held: RunResult


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory: pytest.TempPathFactory) -> TextRuns:
    """Two epochs on the texts with the character tokenizer (300 ids): streamed from the folder in 3 sub-batches,
    and plain from the same texts held in memory. The streamed run is also the one that predict and export read
    (one training serves them all)."""
    folder = tmp_path_factory.mktemp("text-run")
    config = text_config(folder, subdivisions=3)  # 7 = 3 + 2 + 2: uneven
    texts = Path(config["data"]["path"])
    # The same texts, classes and order as JSON Lines, which are tokenized on the host and held in memory.
    files = sorted(texts.glob("negative/*.txt")) + sorted(texts.glob("positive/*.txt"))
    records = [{"text": path.read_text(encoding="utf-8"), "label": path.parent.name} for path in files]
    lines = folder / "texts.jsonl"
    lines.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    in_memory = text_config(folder)
    in_memory["data"] |= {"name": "jsonl", "path": str(lines), "label": "label", "cache": "memory",
                          "tokenizer": config["data"]["tokenizer"]}  # fmt: skip
    initial = build_training(load_config(in_memory)).trained.model.get_weights()
    streamed = train(config, folder / "run", quiet=True)
    held = train(in_memory, folder / "held", quiet=True)
    return TextRuns(config, initial, streamed, held)


@pytest.mark.slow
def test_a_streamed_text_folder_subdivided_trains_as_its_texts_in_memory(text_runs: TextRuns) -> None:
    config, streamed, held = text_runs.config, text_runs.streamed, text_runs.held
    assert load_dataset(load_config(config).data, config["seed"]).streamed
    # 2e-5: the same SGD steps, only float32 sums in another order (the bound of tests/test_lm.py's docstring).
    assert max_difference(streamed.model.get_weights(), held.model.get_weights()) < 2e-5
    assert max_difference(held.model.get_weights(), text_runs.initial) > 1e-2  # it trained
    assert [row["loss"] for row in streamed.metrics] == pytest.approx([row["loss"] for row in held.metrics], 1e-5)
    assert json.loads((streamed.run_dir / "labels.json").read_text()) == ["negative", "positive"]


@pytest.mark.slow
def test_predict_reads_text_files_as_training_read_them(text_runs: TextRuns) -> None:
    run, model = text_runs.streamed.run_dir, text_runs.streamed.model
    texts = run.parent / "texts" / "positive"
    files = sorted(texts.glob("*.txt"))[:3]
    predictions = predict(run, [str(texts)])
    assert [row["input"] for row in predictions.records()][:3] == [str(path) for path in files]
    tokens = CharacterTokenizer(300).encode([path.read_text(encoding="utf-8") for path in files], 40)
    expected = keras.ops.convert_to_numpy(keras.activations.softmax(model(tokens, training=False)))
    got = [[row[f"top{i}_prob"] for i in (1, 2)] for row in predictions.records()[:3]]
    np.testing.assert_allclose(np.sort(expected, axis=1)[:, ::-1], got, atol=1e-6)


@pytest.mark.slow
def test_the_export_takes_strings_and_serves_what_predict_gives(tmp_path: Path, text_runs: TextRuns) -> None:
    run = text_runs.streamed.run_dir
    texts = ["a great film", "réussi, très réussi", "dull 😀 emoji, unknown", "tedious " * 10, "x"]
    exported = export(run)
    assert exported.describe().startswith(f"wrote {exported.path}: serving_default(texts string [None]) -> ")
    serve = tf.saved_model.load(str(exported.path)).signatures["serving_default"]
    served = {key: value.numpy() for key, value in serve(texts=tf.constant(texts)).items()}

    folder = tmp_path / "inputs"
    folder.mkdir()
    for index, text in enumerate(texts):
        (folder / f"{index}.txt").write_text(text, encoding="utf-8")
    rows = predict(run, [str(folder / f"{index}.txt") for index in range(len(texts))]).records()
    labels = ["negative", "positive"]
    predicted = np.array([[row[f"top{i}_prob"] for i in (1, 2)] for row in rows])
    order = np.array([[labels.index(row[f"top{i}_class"]) for i in (1, 2)] for row in rows])
    np.testing.assert_allclose(np.take_along_axis(served["probabilities"], order, axis=1), predicted, atol=1e-5)
    assert [name.decode() for name in served["class_name"]] == [row["prediction"] for row in rows]
    np.testing.assert_array_equal(served["class_index"], order[:, 0])

    # The same texts as the lines of one file (CRLF, a blank line between): predict --lines reads each as an input.
    (folder / "lines.txt").write_text("\r\n".join([*texts[:2], " ", *texts[2:]]) + "\n", encoding="utf-8")
    printed = invoke("predict", str(run), str(folder / "lines.txt"), "--lines", "--top-k", "1")
    assert printed.returncode == 0, printed.stderr
    table = [line.split() for line in printed.stdout.splitlines()[1:]]
    assert [row[0] for row in table] == [f"{folder / 'lines.txt'}:{n}" for n in (1, 2, 4, 5, 6)]
    assert [row[1] for row in table] == [row["prediction"] for row in rows]
    np.testing.assert_allclose([float(row[3]) for row in table], predicted[:, 0], atol=1e-4)  # printed to 4 places

    # A file that is not UTF-8, named once: it is the input.
    (folder / "latin1.txt").write_bytes("café".encode("latin-1"))
    refused = invoke("predict", str(run), str(folder / "latin1.txt"))
    assert refused.returncode == 1 and refused.stderr == f"Error: {folder / 'latin1.txt'}: is not UTF-8 text (byte 3)\n"


def bad_text(tmp: Path, fault: str) -> Path:
    folder = write_text_folder(tmp / "texts", 4)
    if fault == "not-utf8":
        (folder / "positive" / "latin1.txt").write_bytes("café".encode("latin-1"))
    elif fault == "empty-file":
        (folder / "negative" / "blank.txt").write_text("")
    elif fault == "class-without-text":
        (folder / "other").mkdir()
    elif fault == "empty-folder":
        folder = tmp / "nothing"
        folder.mkdir()
    data = {"name": "text_folder", "path": str(folder), "sequence_length": 0 if fault == "length-0" else 16}
    if fault == "cache-disk":
        data["cache"] = "disk"
    if fault == "bucket-streamed":
        data.update(bucket=8, validation_split=0.25)
    training = {"batch_size": 2}
    return write_config(tmp / "bad.yaml", data=data, model={"name": "transformer", "width": 8}, training=training)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("not-utf8", r"data\.path: .*latin1\.txt is not UTF-8 text \(byte 3\)"),
        ("empty-file", r"data\.path: .*blank\.txt is empty"),
        ("class-without-text", r"data\.path: class folder other/ holds no \.txt files"),
        ("empty-folder", r"data\.path: holds no class subfolders; text classification needs one subfolder per class"),
        ("length-0", r"data\.sequence_length: .*greater than or equal to 1"),
        ("cache-disk", r"data\.cache: text_folder keeps token ids in memory or streams its files: none or memory"),
        ("bucket-streamed", r"data\.bucket: orders each batch's texts by length, .* set data\.cache: memory \(got 8\)"),
    ],
)
def test_bad_text_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, message: str
) -> None:
    path = bad_text(tmp_path, fault)
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(path))
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert re.search(message, line), line


def test_a_transformer_on_samples_that_are_not_token_ids_says_what_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path / "digits.yaml", data={"name": "digits"}, model={"name": "transformer"})
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(path))
    assert result.returncode == 1
    assert "model.name: transformer reads token ids: use a text source (data.name: text_folder or text_corpus)" in (
        result.stderr
    )


@pytest.mark.slow
def test_the_text_example_trains_as_documented(tmp_path: Path) -> None:
    # 80 texts: 64 for training, one whole batch of the config's 64 (a short last batch would be a second trace).
    made = invoke("make-example", "text", str(tmp_path / "reviews"), "--count", "80")
    assert made.returncode == 0 and made.stdout.strip() == f"wrote 80 texts to {tmp_path / 'reviews'}"
    config = Path(__file__).resolve().parent.parent / "configs" / "text_classification.yaml"
    overrides = ["--set", f"data.path={tmp_path / 'reviews'}", "--set", "data.sequence_length=32"]
    trained = invoke("train", str(config), "--run-dir", str(tmp_path / "run"), "--epochs", "1", *overrides)
    assert trained.returncode == 0, trained.stderr
    assert "data text_folder: 64 training + 16 validation samples of shape 32, 2 classes" in trained.stdout
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == ["negative", "positive"]
