"""Language models (``text_corpus``, ``causal_lm``): the loss is the mean over the batch's real tokens, however the
batch is cut. Windows of very different real lengths share each batch, so a recipe that averages each sub-batch's
own token mean gets a different update; accumrun's equals the one-pass, hand-written reference.

The runs train a causal convolution (:func:`causal_convolution`), which traces in a fraction of the built-in
transformer's time: the loss over real tokens is the step's, whatever the model. The transformer itself trains here in
the documented example; that it takes any length only when bucketed is tests/test_text_tables.py's.

Tolerance of cut against whole batches (2e-5): both take the same SGD steps (learning rate 0.5, 9 updates) from the
same weights and differ only in the order of float32 sums. A gradient entry sums at most 10 * 24 products of
magnitude about 1: rounding adds as a random walk, sqrt(240) * 2^-24 = 1e-6 per step, and 9 steps at 0.5 carry at
most 9 * 0.5 * 1e-6 = 5e-6 into a weight, under the 2e-5 that the issue asks for."""

from __future__ import annotations

import copy
import json
import math
import re
import signal
from pathlib import Path
from typing import Any, NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import accumrun
from accumrun import load_config, train
from accumrun.config.loading import load_resume_config
from accumrun.core.accumulation import trim_padding
from accumrun.core.sub_batches import batch_sizes, part_bounds, sub_batch_sizes
from accumrun.data.dataset import epoch_order, load_dataset
from accumrun.data.examples import write_corpus, write_text_folder
from accumrun.data.feeder import Feeder
from accumrun.data.source import ArraySource
from accumrun.errors import Interrupted
from accumrun.training.runner import RunResult
from accumrun.training.setup import build_training
from tests.helpers import invoke, max_difference, signal_after_batch, write_config

LEARNING_RATE = 0.5
TIMING_KEYS = {"seconds", "samples_per_second", "peak_rss_mib", "peak_device_mib"}


def causal_convolution(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """Each position's next token from the 3 tokens up to it, for windows of any length (as bucketing needs):
    causal, so the padding after a window's real tokens changes none of their logits."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(classes, 8)(ids)
    x = keras.layers.Conv1D(16, 3, padding="causal", activation="tanh")(x)
    return keras.Model(ids, keras.layers.Dense(classes)(x))


def lm_config(tmp_path: Path, **training: Any) -> dict[str, Any]:
    """A byte-level causal convolution on 5 files of 1 to 30 sentences, in windows of 24 tokens: each file's last
    window is short, so the real lengths in a batch differ widely. Batches of 10, plain SGD."""
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_corpus(corpus, 5, seed=4)
    return {
        "seed": 1,
        "data": {"name": "text_corpus", "path": str(corpus), "sequence_length": 24, "validation_split": 0.1},
        "model": {"name": "tests.test_lm:causal_convolution"},
        "training": {"epochs": 1, "batch_size": 10, "subdivisions": 1, **training},
        "optimizer": {"name": "sgd", "learning_rate": LEARNING_RATE},
        "output": {"tensorboard": False},
    }


def hand_trained(config: dict[str, Any], sub_batch_means: int | None = None) -> list[np.ndarray]:
    """One epoch written out by hand: each batch's loss is the sum of its real tokens' cross-entropy divided by its
    real-token count, and SGD steps once per batch. With ``sub_batch_means=S``, the common recipe instead: the mean
    of the S sub-batches' own token means (the control)."""
    setup = build_training(load_config(config))
    model, train_split = setup.trained.model, setup.fed.dataset.train
    batch_size = config["training"]["batch_size"]
    order = epoch_order(train_split.size, config["seed"], 0, True)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        x, y = tf.constant(train_split.x[rows]), tf.constant(train_split.y[rows])
        with tf.GradientTape() as tape:
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=True))
            real = tf.cast(y != 0, tf.float32)
            if sub_batch_means is None:
                loss = tf.reduce_sum(losses * real) / tf.reduce_sum(real)
            else:
                parts = [part_bounds(i, len(rows), sub_batch_means) for i in range(sub_batch_means)]
                means = [tf.reduce_sum(losses[a:b] * real[a:b]) / tf.reduce_sum(real[a:b]) for a, b in parts]
                loss = tf.add_n(means) / len(means)
        gradients = tape.gradient(loss, model.trainable_variables)
        for variable, gradient in zip(model.trainable_variables, gradients, strict=True):
            variable.assign_sub(LEARNING_RATE * tf.convert_to_tensor(gradient))
    return [v.numpy() for v in model.trainable_variables]


def rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


class Plain(NamedTuple):
    """The config's plain run (one pass per batch): its config, folder, final weights and trainable weights."""

    config: dict[str, Any]
    run_dir: Path
    weights: list[np.ndarray]
    trainable: list[np.ndarray]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Plain:
    """One plain run, shared by the tests that compare with it (a training is mostly its tracing)."""
    folder = tmp_path_factory.mktemp("lm")
    config = lm_config(folder)
    model = train(config, folder / "plain", quiet=True).model
    return Plain(config, folder / "plain", model.get_weights(), [v.numpy() for v in model.trainable_variables])


@pytest.mark.slow
def test_the_loss_divides_by_the_batch_real_tokens_as_a_hand_written_step_does(plain: Plain) -> None:
    config, run_dir, weights = plain.config, plain.run_dir, plain.trainable
    lengths = (load_dataset(load_config(config).data, config["seed"]).train.y != 0).sum(axis=1)  # no model needed
    assert lengths.min() < 12 and lengths.max() == 24  # short last windows beside full ones
    assert max_difference(weights, hand_trained(config)) < 2e-5
    # The control: averaging the sub-batches' own token means weights a short sub-batch's tokens up.
    assert max_difference(weights, hand_trained(config, sub_batch_means=3)) > 1e-2

    (row,) = rows(run_dir)
    # Perplexity is exp of the per-token loss (its metric reads probabilities: float rounding apart).
    assert row["perplexity"] == pytest.approx(math.exp(row["loss"]), rel=1e-4)
    assert row["val_perplexity"] == pytest.approx(math.exp(row["val_loss"]), rel=1e-4)
    assert 0 < row["accuracy"] < 1
    assert not (run_dir / "labels.json").exists()


VARIANTS = ((3, "batch", 8), (4, "sub_batch", 8))
"""Batches of 10 in 3 (3, 3, 4 windows), each batch grouped by length and each sub-batch padded only to its longest
window rounded up to 8 tokens (of 24), whole; and in 4 streamed one sub-batch per call. (Sub-batches padded to the
whole 24 tokens are the bucketed ones' path without the cut: tests/test_tokens.py trains a language model so.)"""


@pytest.fixture(scope="module")
def subdivided(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str, int | None], RunResult]:
    """One run of each of the ``VARIANTS`` on the plain run's corpus, by (subdivisions, feed, bucket): the
    bucketed whole-batch run is also the uninterrupted reference of the resume test (a training apiece saved)."""
    folder = tmp_path_factory.mktemp("lm-subdivided")
    runs: dict[tuple[int, str, int | None], RunResult] = {}
    for subdivisions, feed, bucket in VARIANTS:
        config = lm_config(folder, subdivisions=subdivisions)
        config["data"].update(feed=feed, bucket=bucket)
        runs[subdivisions, feed, bucket] = train(config, folder / f"{subdivisions}-{feed}-{bucket}", quiet=True)
    return runs


@pytest.mark.slow
def test_subdivided_streamed_and_bucketed_language_models_equal_plain(
    plain: Plain, subdivided: dict[tuple[int, str, int | None], RunResult]
) -> None:
    (theirs,) = rows(plain.run_dir)
    for run in subdivided.values():
        name = run.run_dir.name
        assert max_difference(run.model.get_weights(), plain.weights) < 2e-5, name
        (mine,) = rows(run.run_dir)
        for key in ("loss", "accuracy", "perplexity", "val_loss", "val_accuracy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5), (name, key)


@pytest.mark.slow
def test_a_language_model_on_two_replicas_divides_by_the_global_batch_real_tokens(
    plain: Plain, mirrored_strategy: tf.distribute.Strategy, tmp_path: Path
) -> None:
    """The plain run's config on two replicas (tests/conftest.py's logical CPUs), each batch grouped by length, then
    dealt out to the replicas (5 + 5 windows, and the short last batch's), each cutting its 3 sub-batches to multiples
    of 8 tokens. Each replica's slice holds its own count of real tokens; both divide by the global batch's."""
    config = copy.deepcopy(plain.config)
    config["data"]["bucket"] = 8
    config["training"]["subdivisions"] = 3
    config["distribute"] = {"strategy": "mirrored", "logical_cpus": 2}
    result = train(config, tmp_path / "run", quiet=True, strategy=mirrored_strategy)
    assert result.metrics[-1]["replicas"] == 2
    assert max_difference([v.numpy() for v in result.model.trainable_variables], plain.trainable) < 2e-5


def test_trim_padding_cuts_to_the_longest_real_sequence_rounded_up_to_the_bucket() -> None:
    x = tf.constant([[5, 6, 7, 0, 0, 0, 0, 0], [8, 0, 0, 0, 0, 0, 0, 0]])
    y = tf.constant([[6, 7, 9, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0, 0]])
    for bucket, kept in ((1, 3), (2, 4), (4, 4), (16, 8)):
        x_cut, y_cut = trim_padding(x, y, bucket, token_targets=True)
        assert x_cut.shape == y_cut.shape == (2, kept), bucket
        np.testing.assert_array_equal(x_cut, x[:, :kept])
    # Class labels stay whole; an all-padding sub-batch keeps one position.
    x_cut, labels = trim_padding(tf.zeros([2, 8], tf.int32), tf.constant([1, 0]), 4, token_targets=False)
    assert x_cut.shape == (2, 1) and labels.shape == (2,)


def test_bucketed_batches_hold_the_same_samples_ordered_by_length(tmp_path: Path) -> None:
    # 23 samples, labelled by their index, whose real lengths (1 to 6 tokens of 6) repeat: batches of 10, 10, 3.
    lengths = np.array([6, 1, 3, 6, 2, 2, 5, 1, 4, 3, 6, 2, 1, 5, 3, 4, 6, 2, 2, 1, 3, 5, 4])
    tokens = np.where(np.arange(6) < lengths[:, None], 7, 0).astype(np.int32)
    split = ArraySource(tokens, np.arange(23, dtype=np.int32))
    sizes = batch_sizes(23, 10)
    streamed = [size for batch in sizes for size in sub_batch_sizes(batch, 3)]
    plain = Feeder(split, sizes, seed=3, shuffle=True)
    grouped = Feeder(split, sizes, seed=3, shuffle=True, group_by_length=sizes)
    for epoch in (0, 1):
        theirs = [list(y.numpy()) for _, y in plain.epoch(epoch)]
        mine = [list(y.numpy()) for _, y in grouped.epoch(epoch)]
        # The same samples in each batch, by length, ties in the epoch's order (Python's sort is stable too).
        assert mine == [sorted(batch, key=lambda index: lengths[index]) for batch in theirs], epoch
        assert mine != theirs
        # Streamed sub-batches cut the grouped batches; a resumed epoch skips whole batches of them.
        chunks = [list(y.numpy()) for _, y in Feeder(split, streamed, seed=3, shuffle=True,
                                                     group_by_length=sizes).epoch(epoch)]  # fmt: skip
        assert [sum(chunks[3 * b : 3 * b + 3], []) for b in range(3)] == mine
        assert [list(y.numpy()) for _, y in grouped.epoch(epoch, skip=1)] == mine[1:]
    # A run with bucket feeds its batches so, whole or in sub-batches (the step gets what the feeder serves).
    config = lm_config(tmp_path, subdivisions=3)
    config["data"]["bucket"] = 8
    setup = build_training(load_config(config))
    real = np.count_nonzero(setup.fed.dataset.train.x, axis=1)
    feeder = setup.fed.train_feeder([size for chunks in setup.fed.chunk_sizes(3) for size in chunks])
    assert feeder.resident is not None
    batches = [real[feeder.resident.chunk_rows(1, batch)] for batch in range(len(setup.fed.epoch_batch_sizes))]
    assert all(np.all(np.diff(batch) >= 0) for batch in batches)
    assert sum(len(set(batch)) > 1 for batch in batches) >= 2  # batches that mix lengths
    x, _ = setup.fed.first_batch()
    assert np.all(np.diff(np.count_nonzero(x.numpy(), axis=1)) >= 0)


@pytest.mark.slow
def test_a_language_model_stopped_mid_epoch_resumes_to_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subdivided: dict[tuple[int, str, int | None], RunResult]
) -> None:
    # The uninterrupted run is the fixture's bucketed one (3 sub-batches, each batch grouped by length: the resumed
    # epoch's batches are grouped alike). One epoch: the stop lands mid-epoch and the resumed process ends it; the
    # stream continued from a skip in a later epoch is the contract test's (tests/test_sources.py), and a resume
    # into a further epoch is test_text.py's.
    reference = subdivided[3, "batch", 8]
    config = lm_config(tmp_path, subdivisions=3)
    config["data"]["bucket"] = 8
    assert reference.metrics[-1]["optimizer_steps"] > 3  # batch 3 is not the epoch's last
    signal_after_batch(monkeypatch, 3, [signal.SIGINT])
    with pytest.raises(Interrupted):
        train(config, tmp_path / "run", quiet=True)
    monkeypatch.undo()
    assert (tmp_path / "run" / "checkpoints" / "ckpt-epoch00001-batch0000003.npz").is_file()  # inside the epoch
    resumed = train(load_resume_config(tmp_path / "run", None), tmp_path / "run", quiet=True, resume=True)
    assert max_difference(resumed.model.get_weights(), reference.model.get_weights()) == 0.0
    # The per-token loss of the interrupted epoch counts the tokens of both processes' batches.
    assert rows(tmp_path / "run") == rows(reference.run_dir)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("folder", r"data\.task: causal_lm predicts each next token of a text corpus; data\.name: text_folder holds"),
        ("task", r"data\.task: data\.name: text_corpus poses causal_lm \(or set data\.task: auto\) \(got 'classif"),
        ("empty", r"data\.path: folder holds no \.txt files"),
        ("one-token", r"data\.path: holds no text of two tokens or more"),
        ("bucket-xla", r"data\.bucket: cuts sub-batches to lengths known only on the device; XLA"),
    ],
)
def test_bad_language_model_inputs_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, message: str
) -> None:
    config = lm_config(tmp_path)
    if change == "folder":
        config["data"] = {"name": "text_folder", "path": str(write_text_folder(tmp_path / "t", 8)), "task": "causal_lm"}
    elif change == "task":
        config["data"]["task"] = "classification"
    elif change == "bucket-xla":
        config["data"]["bucket"] = 8
        config["training"]["jit_compile"] = True
    elif change == "empty":
        (tmp_path / "empty").mkdir()
        config["data"]["path"] = str(tmp_path / "empty")
    else:
        (tmp_path / "one.txt").write_text("a")
        config["data"]["path"] = str(tmp_path / "one.txt")
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(write_config(tmp_path / "bad.yaml", **config)))
    assert result.returncode == 1, result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_char_lm_example_trains_generates_and_evaluates_as_documented(tmp_path: Path) -> None:
    config = Path(__file__).resolve().parent.parent / "configs" / "char_lm.yaml"
    run = tmp_path / "run"
    # 168 training windows in 3 batches of 56 (one batch shape: the step is traced once), each in the config's 2.
    shorter = ["--set", "data.stride=320", "--set", "data.sequence_length=32", "--set", "training.batch_size=56"]
    trained = invoke("train", str(config), "--run-dir", str(run), "--epochs", "1", *shorter)
    assert trained.returncode == 0, trained.stderr
    assert "data text_corpus: 168 training + 19 validation samples of shape 32, next tokens of 257 ids" in (
        trained.stdout
    )

    # Greedy, from the command line as from Python. The prompt slides: more tokens than the window of 32 still
    # continue from the last 32.
    prompt = "First Citizen:\n" * 4
    greedy = invoke("generate", str(run), "--prompt", prompt, "--max-tokens", "40")
    assert greedy.returncode == 0, greedy.stderr
    long = accumrun.generate(run, prompt, max_tokens=40)
    assert greedy.stdout == long.text + "\n"
    assert long.tokens == 40 and long.text.startswith(prompt)
    # 20 drawn tokens: two seeds give the same 20 draws only by a chance far below 1e-9 (at 257 ids).
    drawn = [accumrun.generate(run, "All:", max_tokens=20, temperature=1.0, seed=seed).text for seed in (1, 1, 2)]
    assert drawn[0] == drawn[1] != drawn[2]

    # evaluate scores the validation windows as training's last row did: the same scorer on the same weights and
    # windows, so the same figures to the bit.
    last = rows(run)[-1]
    scores = accumrun.evaluate(run)
    assert scores["loss"] == last["val_loss"]
    assert scores["perplexity"] == last["val_perplexity"]

    refused = invoke("predict", str(run), str(config))
    assert refused.returncode == 1
    assert "RUN_DIR: is a language model (task causal_lm): continue text with accumrun generate" in refused.stderr


def test_make_example_corpus_writes_text_files_of_very_different_lengths(tmp_path: Path) -> None:
    made = invoke("make-example", "corpus", str(tmp_path / "corpus"), "--count", "20")
    assert made.returncode == 0 and made.stdout.strip() == f"wrote 20 text files to {tmp_path / 'corpus'}"
    sizes = [path.stat().st_size for path in (tmp_path / "corpus").glob("*.txt")]
    assert len(sizes) == 20 and max(sizes) > 5 * min(sizes)
