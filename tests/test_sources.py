"""The source protocol's contract, over every kind of source and every wrapper that applies to it (``data.cache``
none, memory, disk; arrays held resident): for a seed, the same ``(index, x, y, w)`` stream in two epochs, the
same validation hold-out, the same stream continued from a skip, and the weights and lengths each sample carries.
Tiny real files, made once for the module; nothing trains here. Each stream is read once for the module and
compared by every test that needs it (a test that proves a second read gives the same reads it again); a prepared
TFDS dataset joins the sources where ``tensorflow-datasets`` is installed."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accumrun.config.schema import data_config
from accumrun.data.dataset import Dataset, load_dataset
from accumrun.data.examples import write_corpus, write_image_folder, write_text_folder, write_tfrecords, write_tokens
from accumrun.data.resident import ResidentArrays
from accumrun.data.source import Source

SEED = 5
SIZE = 8

Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]
"""A stream's indices, samples, targets and weights (None without weights), in its order."""


def write_tables(folder: Path) -> dict[str, Path]:
    """A CSV of numbers with a weight column, a CSV with a text column, and a JSON Lines file of texts."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    words = ["good", "bad", "the", "film", "plot", "very", "dull", "superb", "réussi"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 12)))) for _ in range(21)]
    numbers = ["a,b,label,weight", *(f"{i * 0.5},{-i},{i % 3},{1 + i % 4}" for i in range(21))]
    (folder / "numbers.csv").write_text("\n".join(numbers) + "\n")
    text_rows = ["text,label", *(f'"{text}",{"pos" if i % 2 else "neg"}' for i, text in enumerate(texts))]
    (folder / "texts.csv").write_text("\n".join(text_rows) + "\n", encoding="utf-8")
    lines = [json.dumps({"text": text, "label": i % 3}) for i, text in enumerate(texts)]
    (folder / "texts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {name: folder / name for name in ("numbers.csv", "texts.csv", "texts.jsonl")}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sources")
    rng = np.random.default_rng(1)
    np.savez(root / "arrays.npz", x=rng.normal(size=(19, 3)), y=rng.integers(0, 3, 19), w=rng.uniform(0.5, 2.0, 19))
    records = write_tfrecords(root / "records" / "shapes", count=17, size=SIZE, seed=2, shards=3)
    tables = write_tables(root / "tables")
    return {
        "npz": str(root / "arrays.npz"),
        "image_folder": str(write_image_folder(root / "images", count=14, size=SIZE, seed=3)),
        "tfrecord": str(records[0].parent / "shapes-*"),
        "csv": str(tables["numbers.csv"]),
        "csv_text": str(tables["texts.csv"]),
        "jsonl": str(tables["texts.jsonl"]),
        "text_folder": str(write_text_folder(root / "texts", count=14, seed=4)),
        "text_corpus": str(write_corpus(root / "corpus", count=5, seed=5)),
        "tokens": str(write_tokens(root / "tokens", count=10, seed=6)[0]),
        "cache_dir": str(root / "cache"),
        **({"tfds": prepared_tfds(root / "tfds")} if TFDS else {}),
    }


def prepared_tfds(data_dir: Path) -> str:
    """tests/tfds_tiny.py's dataset (23 training and 6 test images of two classes) prepared in ``data_dir``."""
    from tests.tfds_tiny import AccumrunTiny

    AccumrunTiny(data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir)


SECTIONS: dict[str, Callable[[dict[str, str]], dict[str, Any]]] = {
    "npz": lambda files: {"name": "npz", "path": files["npz"], "weight": "w"},
    "digits": lambda files: {"name": "digits"},
    "synthetic": lambda files: {"name": "synthetic", "samples": 23, "shape": [4]},
    "image_folder": lambda files: {"name": "image_folder", "path": files["image_folder"], "image_size": [SIZE, SIZE]},
    "tfrecord": lambda files: {
        "name": "tfrecord",
        "path": files["tfrecord"],
        "image_size": [SIZE, SIZE],
        "shuffle_buffer": 5,
    },
    "csv": lambda files: {"name": "csv", "path": files["csv"], "label": "label", "weight": "weight"},
    "csv_text": lambda files: {"name": "csv", "path": files["csv_text"], "label": "label", "text": "text"},
    "jsonl": lambda files: {"name": "jsonl", "path": files["jsonl"], "label": "label", "sequence_length": 9},
    "text_folder": lambda files: {"name": "text_folder", "path": files["text_folder"], "sequence_length": 12},
    "text_corpus": lambda files: {"name": "text_corpus", "path": files["text_corpus"], "sequence_length": 24},
    "tokens": lambda files: {"name": "tokens", "path": files["tokens"], "vocabulary_size": 256, "sequence_length": 20},
    "tfds": lambda files: {
        "name": "tfds",
        "dataset": "accumrun_tiny",
        "data_dir": files["tfds"],
        "image_size": [SIZE, SIZE],
        "shuffle_buffer": 5,
    },
}
"""Each kind of source's data section (its files made by :func:`files`)."""

WRAPPERS = {
    "image_folder": ("memory", "disk"),
    "tfrecord": ("memory", "disk"),
    "csv_text": ("memory",),
    "jsonl": ("memory",),
    "text_folder": ("memory",),
    "text_corpus": ("memory", "disk"),
}
"""The caches each kind takes besides ``none`` (set as ``none`` too, where a kind's default is another)."""

TFDS = importlib.util.find_spec("tensorflow_datasets") is not None
"""Whether ``tensorflow-datasets`` (optional) is installed: the ``tfds`` source's cases run only then."""

CASES = [(kind, "none") for kind in SECTIONS if kind != "tfds" or TFDS] + [
    (kind, cache) for kind, caches in WRAPPERS.items() for cache in caches
]


@pytest.fixture(scope="module")
def datasets(files: dict[str, str]) -> Callable[[str, str], Dataset]:
    """The dataset of a kind of source under a cache, loaded once for the module."""
    loaded: dict[tuple[str, str], Dataset] = {}

    def dataset(kind: str, cache: str) -> Dataset:
        if (kind, cache) not in loaded:
            section = {**SECTIONS[kind](files), "validation_split": 0.25}
            if kind in WRAPPERS:
                section["cache"] = cache
                if cache == "disk":
                    section["cache_dir"] = files["cache_dir"]
            loaded[kind, cache] = load_dataset(data_config(**section), seed=SEED)
        return loaded[kind, cache]

    return dataset


def streamed(split: Source, epoch: int, skip: int = 0, shuffle: bool = True, blocks: bool = False) -> Stream:
    """The split's stream for ``epoch`` of :data:`SEED`, as arrays; with ``blocks``, read as its blocks (what the
    feeder cuts into chunks) instead."""
    indices, x, y, w = [], [], [], []
    read = split.blocks(epoch, SEED, shuffle, skip) if blocks else split.stream(epoch, SEED, shuffle, skip).batch(64)
    for index, sample, target in read.as_numpy_iterator():
        weighted = hasattr(target, "weights")
        indices.append(index)
        x.append(sample)
        y.append(target.targets if weighted else target)
        w.append(target.weights if weighted else None)
    weights = None if not w or w[0] is None else np.concatenate(w)
    return np.concatenate(indices), np.concatenate(x), np.concatenate(y), weights


def sample_weights(split: Source) -> np.ndarray:
    """Weights that differ from sample to sample, given to the split by the tests of weights."""
    return np.linspace(0.5, 2.0, split.size).astype(np.float32)


Reads = Callable[..., Stream]
"""The ``reads`` fixture: ``reads(kind, cache, epoch, skip=0, blocks=False, weighted=False, split="train")``."""


@pytest.fixture(scope="module")
def reads(datasets: Callable[[str, str], Dataset]) -> Reads:
    """A stream of a kind of source under a cache (:func:`streamed`, the training split with
    :func:`sample_weights` where ``weighted``, the held-out split unshuffled where ``split`` is ``val``), read once
    for the module: the tests compare the same reads, and each test that proves a second read equals the first
    reads it itself."""
    done: dict[tuple[Any, ...], Stream] = {}

    def read(
        kind: str,
        cache: str,
        epoch: int,
        skip: int = 0,
        blocks: bool = False,
        weighted: bool = False,
        split: str = "train",
    ) -> Stream:
        key = (kind, cache, epoch, skip, blocks, weighted, split)
        if key not in done:
            dataset = datasets(kind, cache)
            if split == "val":
                assert dataset.val is not None
                done[key] = streamed(dataset.val, epoch, skip, shuffle=False, blocks=blocks)
            else:
                source = dataset.train.with_weights(sample_weights(dataset.train)) if weighted else dataset.train
                done[key] = streamed(source, epoch, skip, blocks=blocks)
        return done[key]

    return read


def assert_same(a: Stream, b: Stream) -> None:
    for left, right in zip(a, b, strict=True):
        if left is None or right is None:
            assert left is None and right is None
        else:
            np.testing.assert_array_equal(left, right)


def by_index(split: Source, values: np.ndarray) -> dict[int, Any]:
    """Per-sample ``values`` (in the split's order) by each sample's index in the stream."""
    return dict(zip(split.indices.tolist(), values, strict=True))


@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_the_same_stream_for_a_seed_and_epoch_with_any_cache(
    datasets: Callable[[str, str], Dataset], reads: Reads, kind: str, cache: str
) -> None:
    dataset = datasets(kind, cache)
    first, second = reads(kind, cache, 0), reads(kind, cache, 1)
    # Read again, the same (under cache none this is the uncached read the cached ones are compared to).
    assert_same(first, streamed(dataset.train, 0))
    if cache != "none":  # and as read without the cache (CASES puts each kind's none first: its reads are done)
        assert_same(first, reads(kind, "none", 0))
        assert_same(second, reads(kind, "none", 1))
    assert_same(first, reads(kind, cache, 0, blocks=True))  # and as the feeder reads it, in blocks
    assert sorted(first[0].tolist()) == sorted(second[0].tolist()) == sorted(dataset.train.indices.tolist())
    assert first[0].tolist() == dataset.train.order(0, SEED, True).tolist()  # the order, known without reading
    assert first[0].tolist() != second[0].tolist()  # each epoch has an order of its own
    assert first[1].shape[1:] == dataset.sample_shape and first[1].dtype == dataset.dtype
    if dataset.train.gathers:  # and gathered in one call, as the feeder reads it without augmentation
        x, y = dataset.train.with_weights(sample_weights(dataset.train)).gather(dataset.train.order(0, SEED, True))
        expected = reads(kind, cache, 0, weighted=True)
        assert_same((expected[0], x.numpy(), y.targets.numpy(), y.weights.numpy()), expected)


@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_the_same_hold_out_with_any_cache(
    datasets: Callable[[str, str], Dataset], reads: Reads, kind: str, cache: str
) -> None:
    dataset, plain = datasets(kind, cache), datasets(kind, "none")
    assert dataset.val is not None and plain.val is not None
    assert (dataset.train_size, dataset.val_size) == (plain.train_size, plain.val_size)
    held_out = reads(kind, cache, 0, split="val")
    assert_same(held_out, reads(kind, "none", 0, split="val"))
    assert not set(held_out[0].tolist()) & set(dataset.train.indices.tolist()) or dataset.train.indexed


@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_a_stream_continued_from_a_skip_reads_on(reads: Reads, kind: str, cache: str) -> None:
    whole = reads(kind, cache, 1)
    resumed = reads(kind, cache, 1, skip=3)
    assert_same(resumed, tuple(None if part is None else part[3:] for part in whole))  # type: ignore[arg-type]
    assert_same(reads(kind, cache, 1, skip=3, blocks=True), resumed)


@pytest.mark.parametrize(("kind", "cache"), CASES)
def test_weights_and_lengths_stay_with_their_samples(
    datasets: Callable[[str, str], Dataset], reads: Reads, kind: str, cache: str
) -> None:
    split = datasets(kind, cache).train
    indices, x, _, w = reads(kind, cache, 0, weighted=True)
    assert w is not None
    expected = by_index(split, sample_weights(split))
    np.testing.assert_array_equal(w, [expected[i] for i in indices.tolist()])
    if split.lengths is not None:
        lengths = by_index(split, split.lengths)
        real = np.count_nonzero(x.reshape(len(x), -1), axis=1)
        np.testing.assert_array_equal([lengths[i] for i in indices.tolist()], real)


@pytest.mark.parametrize("kind", ["npz", "csv"])
def test_a_weight_read_from_the_file_is_the_samples_own(
    datasets: Callable[[str, str], Dataset], reads: Reads, kind: str
) -> None:
    split = datasets(kind, "none").train
    assert split.w is not None
    indices, x, _, w = reads(kind, "none", 0)
    expected = by_index(split, split.w)
    np.testing.assert_array_equal(w, [expected[i] for i in indices.tolist()])
    if kind == "csv":  # the table's weight column is 1 + row % 4, and its first feature row / 2
        np.testing.assert_array_equal(w, 1 + (x[:, 0] * 2).astype(int) % 4)


@pytest.mark.skipif(not TFDS, reason="tensorflow-datasets is not installed")
def test_a_prepared_tfds_dataset_names_its_classes_and_holds_out_its_test_split(files: dict[str, str]) -> None:
    # It streams as TFRecord files do: the contract above holds for it as for them.
    dataset = load_dataset(data_config(**SECTIONS["tfds"](files), validation_split="test"), seed=0)
    assert (dataset.train_size, dataset.val_size, dataset.class_names) == (23, 6, ["cat", "dog"])


HELD = {
    ("npz", "none"),
    ("digits", "none"),
    ("synthetic", "none"),
    ("csv", "none"),
    ("text_corpus", "memory"),
    ("image_folder", "memory"),
    ("csv_text", "memory"),
    ("jsonl", "memory"),
    ("text_folder", "memory"),
}
"""The cases whose training split is arrays in host memory, which the run holds as one tensor (resident); every
other split is read through ``tf.data`` (a TFRecord cache in memory too: it keeps the records' own order)."""


@pytest.mark.parametrize(("kind", "cache"), [case for case in CASES if case[1] in ("none", "memory")])
def test_resident_arrays_serve_the_stream(
    datasets: Callable[[str, str], Dataset], reads: Reads, kind: str, cache: str
) -> None:
    split = datasets(kind, cache).train
    held = split.in_memory
    assert (held is not None) == ((kind, cache) in HELD)
    if held is None:  # read through tf.data: the stream tests above cover it
        return
    starts = np.array([*range(0, split.size, 4), split.size])
    resident = ResidentArrays(split, starts, seed=SEED, shuffle=True, on_device=False)
    for epoch in (0, 1):
        chunks = list(resident.chunks(epoch, skip=1))
        # The stream after its first chunk of 4 (what a skip reads, as the skip test proves).
        _, x, y, _ = reads(kind, cache, epoch)
        np.testing.assert_array_equal(np.concatenate([chunk[0].numpy() for chunk in chunks]), x[4:])
        targets = [getattr(chunk[1], "targets", chunk[1]).numpy() for chunk in chunks]
        np.testing.assert_array_equal(np.concatenate(targets), y[4:])
