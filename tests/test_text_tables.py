"""Text in tables: a CSV's ``data.text`` column and JSON Lines files, tokenized at load (``cache: memory``) or
streamed from the file (``cache: none``) to the same samples; text classification from them trains streamed and
subdivided as in memory and plain, and bad rows are refused in one line that names the line."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from accumrun import evaluate, load_config, predict, train
from accumrun.config.schema import data_config
from accumrun.core.targets import unweighted, weights_of
from accumrun.data.dataset import load_dataset, with_class_weights
from accumrun.data.examples import write_text_folder
from accumrun.data.feeder import Feeder
from accumrun.data.inputs import InputKind, read_inputs
from accumrun.data.rows import TextRows
from accumrun.data.source import ArraySource
from accumrun.data.tokenizers.byte import ByteTokenizer
from accumrun.data.tokenizers.character import CharacterTokenizer
from accumrun.errors import DataError
from accumrun.training.runner import RunResult
from accumrun.training.setup import build_training
from tests.helpers import invoke, max_difference, write_config


def reviews(tmp_path: Path, count: int = 24) -> list[tuple[str, str]]:
    """``count`` short reviews (1 to 24 words, a few accented) and their class, alternating."""
    folder = write_text_folder(tmp_path / "made", count)
    files = sorted(folder.rglob("*.txt"), key=lambda path: path.name)
    return [(path.read_text(encoding="utf-8"), path.parent.name) for path in files]


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    """The reviews as a table: a numeric ``stars`` column (no feature when there is a text column), the text, the
    class name."""
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["stars", "review", "sentiment"])
        writer.writerows([[index % 5, text, label] for index, (text, label) in enumerate(rows)])
    return path


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records), encoding="utf-8")
    return path


def table_config(data: dict[str, Any], **training: Any) -> dict[str, Any]:
    """The text test's tiny transformer, without dropout (whose masks are drawn by a sample's row, which grouping by
    length moves; dropout with subdivisions on streamed text is tests/test_text.py's), and 3 batches of 7 of the 21
    training rows (one batch shape, so the step is traced once a run), SGD."""
    return {
        "seed": 2,
        "data": {"sequence_length": 32, **data},
        "model": {"name": "transformer", "layers": 1, "heads": 2, "width": 16, "dropout": 0.0},
        "training": {"epochs": 2, "batch_size": 7, "subdivisions": 1, **training},
        "optimizer": {"name": "sgd", "learning_rate": 0.3},
        "output": {"tensorboard": False},
    }


def test_a_text_column_and_json_lines_are_their_texts_tokens(tmp_path: Path) -> None:
    rows = reviews(tmp_path, 12)
    texts = [text for text, _ in rows]
    table = write_csv(tmp_path / "reviews.csv", rows)
    config = data_config(name="csv", path=str(table), label="sentiment", text="review", validation_split=0.0,
                         cache="memory")  # fmt: skip
    dataset = load_dataset(config, seed=0)
    np.testing.assert_array_equal(dataset.train.x, ByteTokenizer().encode(texts, 256))
    np.testing.assert_array_equal(dataset.train.y, [["negative", "positive"].index(label) for _, label in rows])
    assert (dataset.features, dataset.vocabulary_size, dataset.labels) == (None, 257, ["negative", "positive"])

    lines = write_jsonl(
        tmp_path / "reviews.jsonl", [{"body": text, "y": i % 3, "x": 1} for i, text in enumerate(texts)]
    )
    tokenizer = {"name": "character", "vocabulary_size": 300}
    config = data_config(name="jsonl", path=str(lines), text="body", label="y", tokenizer=tokenizer,
                         sequence_length=20, validation_split=0.0, cache="memory")  # fmt: skip
    dataset = load_dataset(config, seed=0)
    np.testing.assert_array_equal(dataset.train.x, CharacterTokenizer(300).encode(texts, 20))
    np.testing.assert_array_equal(dataset.train.y, np.arange(12) % 3)
    assert (dataset.vocabulary_size, dataset.labels) == (300, ["0", "1", "2"])


def test_streamed_table_text_is_the_samples_of_the_table_in_memory(tmp_path: Path) -> None:
    texts = ["plain\u2028separated", 'a "quoted" word, and a comma', "two\nlines\r\nand a return",
             "réussi, très 😀", "  spaced  ", "long " * 12]  # fmt: skip
    rows = [(text, ["negative", "positive"][i % 2]) for i, text in enumerate(texts * 3)]
    table = tmp_path / "t.csv"
    with table.open("w", newline="", encoding="utf-8-sig") as file:  # a byte-order mark, csv's \r\n line ends
        csv.writer(file).writerows([["review", "weight", "sentiment"], *([t, 1 + i % 3, y] for i, (t, y) in
                                                                        enumerate(rows))])  # fmt: skip
    lines = tmp_path / "t.jsonl"
    records = [json.dumps({"text": t, "label": y}, ensure_ascii=False) + "\r\n" for t, y in rows]
    lines.write_text("".join(records[:5]) + "\n" + "".join(records[5:]), encoding="utf-8-sig")  # a blank line
    character = {"name": "character", "vocabulary_size": 300}
    sources = ({"name": "csv", "path": str(table), "label": "sentiment", "text": "review", "weight": "weight"},
               {"name": "jsonl", "path": str(lines), "label": "label", "tokenizer": character})  # fmt: skip
    for section in sources:
        streamed, held = (
            load_dataset(data_config(**section, sequence_length=24, validation_split=0.25, cache=cache), seed=5)
            for cache in ("none", "memory")
        )
        assert isinstance(streamed.train, TextRows) and streamed.streamed and isinstance(held.train, ArraySource)
        assert (streamed.val_size, streamed.labels) == (held.val_size, held.labels) == (4, ["negative", "positive"])
        for mine, theirs in ((streamed.train, held.train), (streamed.val, held.val)):
            assert mine is not None and theirs is not None
            sizes = [5] * (mine.size // 5) + [mine.size % 5] * (mine.size % 5 > 0)
            fed = [list(Feeder(split, sizes, seed=5, shuffle=True).epoch(1)) for split in (mine, theirs)]
            for (x, y), (x_held, y_held) in zip(*fed, strict=True):
                np.testing.assert_array_equal(x.numpy(), x_held.numpy())
                np.testing.assert_array_equal(unweighted(y).numpy(), unweighted(y_held).numpy())
                weights, held_weights = weights_of(y), weights_of(y_held)
                assert (weights is None) == (held_weights is None) == (section["name"] == "jsonl")
                if weights is not None and held_weights is not None:
                    np.testing.assert_array_equal(weights.numpy(), held_weights.numpy())
            # A resumed epoch skips its first chunk and reads the rest alike.
            skipped = list(Feeder(mine, sizes, seed=5, shuffle=True).epoch(1, skip=1))
            for (x, _), (x_first, _) in zip(skipped, fed[0][1:], strict=True):
                np.testing.assert_array_equal(x.numpy(), x_first.numpy())
        weighted = (with_class_weights(dataset, {"positive": 3.0}).train.w for dataset in (streamed, held))
        np.testing.assert_array_equal(*weighted)

    # A file changed since startup is found when training reads it, and the record named.
    lines.write_text("{}\n" * 3000, encoding="utf-8")  # long enough to hold every span, none a record
    changed = rf"data: {re.escape(str(lines))}, the record at byte \d+ cannot be read as text \(not the record read"
    with pytest.raises(DataError, match=changed):
        list(Feeder(streamed.train, [5], seed=5, shuffle=True).epoch(0))


class Table(NamedTuple):
    """The reviews as a CSV (``data``, streamed), and the plain run on it held in memory, its rows named by their
    ``stars`` column (``plain``): the run that predict and evaluate read, and the subdivided run's reference."""

    folder: Path
    rows: list[tuple[str, str]]
    data: dict[str, Any]
    initial: list[np.ndarray]
    plain: RunResult


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    folder = tmp_path_factory.mktemp("table")
    rows = reviews(folder)
    data = {"name": "csv", "path": str(write_csv(folder / "reviews.csv", rows)), "label": "sentiment",
            "text": "review"}  # fmt: skip
    # The id column names the rows for predict; it is no feature, so the samples are those of the table without it.
    held = table_config({**data, "id": "stars", "cache": "memory"})
    initial = build_training(load_config(held)).trained.model.get_weights()
    return Table(folder, rows, data, initial, train(held, folder / "plain", quiet=True))


@pytest.mark.slow
def test_text_classification_from_csv_streamed_and_subdivided_equals_in_memory_and_plain(
    tmp_path: Path, table: Table
) -> None:
    rows, plain, initial = table.rows, table.plain, table.initial
    records = [{"text": text, "label": ["negative", "positive"].index(label)} for text, label in rows]
    lines = {"name": "jsonl", "path": str(write_jsonl(tmp_path / "reviews.jsonl", records)), "label": "label"}
    # Streamed (the default), 7 = 3 + 2 + 2: each row's text read back from the file as the order reaches it.
    subdivided = train(table_config(table.data, subdivisions=3), tmp_path / "subdivided", quiet=True)
    assert load_dataset(load_config(table_config(table.data)).data, seed=2).streamed
    assert max_difference(subdivided.model.get_weights(), plain.model.get_weights()) < 2e-5
    assert max_difference(plain.model.get_weights(), initial) > 1e-2  # it trained
    assert [row["loss"] for row in subdivided.metrics] == pytest.approx([row["loss"] for row in plain.metrics], 1e-5)
    assert json.loads((plain.run_dir / "labels.json").read_text()) == ["negative", "positive"]
    assert not (plain.run_dir / "features.json").exists()
    assert plain.model.input_shape == (None, 32)  # without data.bucket the transformer takes exactly its length
    # The same texts and classes, in the same order, from JSON Lines: the same samples, so the same training.
    # (The data as a run loads it, without building a model for it: byte tokens learn no vocabulary.)
    from_table, from_lines = (
        load_dataset(load_config(table_config({**data, "cache": "memory"})).data, seed=2)
        for data in (table.data, lines)
    )
    for mine, theirs in ((from_lines.train, from_table.train), (from_lines.val, from_table.val)):
        np.testing.assert_array_equal(mine.x, theirs.x)
        np.testing.assert_array_equal(mine.y, theirs.y)
    assert from_lines.labels == ["0", "1"]


@pytest.mark.slow
def test_predict_and_evaluate_read_files_laid_out_as_the_runs_own_table(tmp_path: Path, table: Table) -> None:
    # Only the columns the run reads: the text, and the id that names each row (the label is not needed to predict).
    texts = ["a warm, generous film", "dull and far too long", "ça alors, quelle fin !"]
    with (tmp_path / "few.csv").open("w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([["review", "stars"], *((text, f"r{i}") for i, text in enumerate(texts))])
    for i, text in enumerate(texts):
        (tmp_path / f"r{i}.txt").write_text(text, encoding="utf-8")
    run = table.plain  # held in memory, its rows named by the id column

    from_table = predict(run.run_dir, [tmp_path / "few.csv"]).records()
    from_files = predict(run.run_dir, [tmp_path / f"r{i}.txt" for i in range(3)]).records()
    assert [record["input"] for record in from_table] == ["r0", "r1", "r2"]
    for mine, theirs in zip(from_table, from_files, strict=True):
        assert mine["prediction"] == theirs["prediction"]
        assert mine["top1_prob"] == pytest.approx(theirs["top1_prob"], abs=1e-6)
    # evaluate --data: the loss is the mean of -log p(true class) over the file's rows, as predict gives them.
    labels = ["positive", "negative", "positive"]
    with (tmp_path / "scored.csv").open("w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([["stars", "review", "sentiment"], *zip(range(3), texts, labels, strict=True)])
    scored = evaluate(run.run_dir, data=tmp_path / "scored.csv")
    probability = [{r["top1_class"]: r["top1_prob"], r["top2_class"]: r["top2_prob"]} for r in from_table]
    true_class = [p[label] for p, label in zip(probability, labels, strict=True)]
    assert scored["samples"] == 3
    assert scored["loss"] == pytest.approx(-np.mean(np.log(true_class)), abs=1e-5)


def test_a_json_lines_file_in_the_runs_layout_is_its_texts_named_by_id(tmp_path: Path) -> None:
    texts = ["first review", "second,\n with a break"]
    lines = write_jsonl(tmp_path / "few.jsonl", [{"text": text, "key": f"k{i}"} for i, text in enumerate(texts)])
    data = load_config(table_config({"name": "jsonl", "path": str(lines), "label": "label", "id": "key"})).data
    kind = InputKind((16,), np.dtype(np.int32), tokenizer=ByteTokenizer(), text_table=data)
    (group,) = read_inputs([str(lines)], kind)
    assert group.names == ["k0", "k1"]
    np.testing.assert_array_equal(group.split.x, ByteTokenizer().encode(texts, 16))
    assert "a .jsonl laid out as the training data" in kind.describe()


def bad_table(tmp: Path, fault: str) -> Path:
    good = [{"text": "a good film", "label": "positive"}, {"text": "a bad film", "label": "negative"}]
    data: dict[str, Any] = {"name": "jsonl", "path": str(tmp / "t.jsonl"), "label": "label", "sequence_length": 8}
    records: list[Any] = [*good, *good]
    if fault == "no-text-key":
        records[2] = {"review": "fine", "label": "positive"}
    elif fault == "no-label-key":
        records[3] = {"text": "fine"}
    elif fault == "text-not-string":
        records[0] = {"text": 5, "label": "positive"}
    elif fault == "empty-text":
        records[1] = {"text": "", "label": "negative"}
    elif fault == "not-an-object":
        records[1] = ["a good film", "positive"]
    write_jsonl(tmp / "t.jsonl", records)
    if fault == "not-json":
        (tmp / "t.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", label}\n')
    elif fault == "empty-file":
        (tmp / "t.jsonl").write_text("\n\n")
    elif fault.startswith("csv"):
        (tmp / "t.csv").write_text("review,label\nfine,positive\n,negative\n")
        data = {"name": "csv", "path": str(tmp / "t.csv"), "label": "label", "text": "review"}
        if fault == "csv-no-text-column":
            data["text"] = "body"
        elif fault == "csv-tokenizer-without-text":
            data = {**data, "text": None, "tokenizer": {"name": "byte"}}
        elif fault == "csv-bucket-without-text":
            data = {**data, "text": None, "bucket": 8}
        elif fault == "csv-cache-without-text":
            data = {**data, "text": None, "cache": "memory"}
        elif fault == "csv-cache-disk":
            data["cache"] = "disk"
        elif fault == "csv-bucket-streamed":
            (tmp / "t.csv").write_text("review,label\n" + "fine,positive\nawful,negative\n" * 5)
            data["bucket"] = 8
    if fault == "jsonl-cache-disk":
        data["cache"] = "disk"
    return write_config(
        tmp / "bad.yaml", data=data, model={"name": "transformer", "width": 8}, training={"batch_size": 2}
    )


@pytest.mark.slow
def test_bucketed_text_classification_from_csv_equals_plain(tmp_path: Path, table: Table) -> None:
    # Each batch grouped by length and its 3 sub-batches cut to multiples of 8 tokens give the plain update (2e-5:
    # float32 sums in another order, the bound of tests/test_lm.py's docstring).
    bucketed = train(
        table_config({**table.data, "bucket": 8, "cache": "memory"}, subdivisions=3), tmp_path / "run", quiet=True
    )
    assert bucketed.model.input_shape == (None, None)
    assert max_difference(bucketed.model.get_weights(), table.plain.model.get_weights()) < 2e-5


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("no-text-key", r"data\.text: .*t\.jsonl, line 3: no key 'text'; it has \['label', 'review'\]"),
        ("no-label-key", r"data\.label: .*t\.jsonl, line 4: no key 'label'; it has \['text'\]"),
        ("text-not-string", r"data\.text: .*t\.jsonl, line 1: 'text' is not a string \(got 5\)"),
        ("empty-text", r"data\.text: .*t\.jsonl, line 2: 'text' is empty"),
        ("not-an-object", r"data\.path: .*t\.jsonl, line 2: a JSON list, not an object"),
        ("not-json", r"data\.path: .*t\.jsonl, line 2: not JSON \(Expecting property name enclosed"),
        ("empty-file", r"data\.path: .*t\.jsonl is empty; it needs one JSON object per line"),
        ("csv-empty-text", r"data\.text: .*t\.csv, line 3: the text in column 'review' is empty"),
        ("csv-no-text-column", r"data\.text: .*t\.csv has no column 'body'; its columns are \['review', 'label'\]"),
        ("csv-tokenizer-without-text", r"data: tokenizer and sequence_length apply to a text column: set data\.text"),
        (
            "csv-bucket-without-text",
            r"data\.bucket: pads token ids: it applies to a text column; set data\.text too \(got 8\)",
        ),
        ("csv-cache-without-text", r"data: cache applies to a text column \(a table of numbers is held in memory\)"),
        ("csv-cache-disk", r"data\.cache: csv keeps token ids in memory or streams its rows: none or memory"),
        ("jsonl-cache-disk", r"data\.cache: jsonl keeps token ids in memory or streams its lines: none or memory"),
        (
            "csv-bucket-streamed",
            r"data\.bucket: orders each batch's texts by length, .* this table streams its rows: set data\.cache: "
            r"memory \(got 8\)",
        ),
    ],
)
def test_a_bad_text_table_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, message: str
) -> None:
    path = bad_table(tmp_path, fault)
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(path))
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert re.search(message, line), line
