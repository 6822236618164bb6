"""Bad inputs through the command line: each is refused with its exit code, one clear line and no debris.

Every row is one user mistake: the files it needs, the command line, the exit code and a fragment of the message
that names the fault. Each runs the ``accumrun`` command in this process through click's runner, in a folder of
its own, so TensorFlow starts once for the whole table; tests/test_cli.py shows on a real process that an error
leaves nothing else on stderr. Faults that take the same path as a row here are checked on the API at the end.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from accumrun.config.schema import OptimizerConfig, data_config
from accumrun.data.arrays import IDX_FILES
from accumrun.data.dataset import load_dataset
from accumrun.errors import ConfigError, DataError
from tests.helpers import idx_bytes, invoke, tiny_config, write_config, write_idx_folder

# Each row runs in a folder of its own; "{tmp}" in its arguments becomes that folder.
CONFIG = "{tmp}/tiny.yaml"
RUN_DIR = "{tmp}/run"
TRAIN = ("train", CONFIG, "--run-dir", RUN_DIR)
# Valid samples, labels and IDX images, from which the rows' bad ones are made.
X = np.zeros((6, 4), dtype=np.float32)
Y = np.array([0, 1, 2, 0, 1, 2])
IMAGES = np.arange(6 * 3 * 2, dtype=np.uint8).reshape(6, 3, 2)


@dataclass(frozen=True)
class Case:
    """One bad input: what to write, what to run, and how the command line must answer."""

    id: str
    build: Callable[[Path], object]
    """Writes the row's files into its folder (the return value is ignored)."""
    args: tuple[str, ...]
    exit_code: int
    fragment: str
    """Part of the message that names the fault, matched case-insensitively."""


# --- builders -------------------------------------------------------------------------------------------------


def nothing(tmp: Path) -> None:
    """For rows whose fault is on the command line alone."""


def write_text(tmp: Path, text: str) -> None:
    """A config file that holds ``text`` as it is."""
    (tmp / "tiny.yaml").write_text(text)


def config_with(tmp: Path, **sections: Any) -> Path:
    """The tiny config with whole sections replaced; ``tiny_config`` merges into its sections instead."""
    resolved = yaml.safe_load(tiny_config(tmp).read_text())
    return write_config(tmp / "tiny.yaml", **{**resolved, **sections})


def npz_config(tmp: Path, task: str = "auto", loss: dict[str, Any] | None = None, **arrays: np.ndarray) -> Path:
    """The tiny config reading ``data.npz``, which holds ``arrays``, for ``task`` (and ``loss``), in batches of 4:
    the 5 training samples of the rows' 6 would not fill the tiny config's batch of 10."""
    np.savez(tmp / "data.npz", **arrays)
    sections: dict[str, Any] = {
        "data": {"name": "npz", "path": str(tmp / "data.npz"), "task": task},
        "training": {"batch_size": 4},
    }
    return config_with(tmp, **sections, **({"loss": loss} if loss else {}))


def saved_model_config(tmp: Path, outputs: int) -> Path:
    """The tiny config training a saved Keras model of ``outputs`` logits (the data has 3 classes)."""
    import keras  # imported by the rows that need it only

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(outputs)])
    model.save(tmp / "user.keras")
    return config_with(tmp, model={"name": "saved", "path": str(tmp / "user.keras")})


def lbfgs_config(tmp: Path, training: dict[str, Any] | None = None, **sections_or_keys: Any) -> Path:
    """The tiny config on the full batch with L-BFGS: ``data`` and ``model`` replace those sections whole; any
    other keyword is an optimizer key."""
    sections = {key: sections_or_keys.pop(key) for key in ("data", "model") if key in sections_or_keys}
    optimizer = {"name": "lbfgs", **sections_or_keys}
    resolved = yaml.safe_load(tiny_config(tmp).read_text())
    training = {**resolved["training"], "batch_size": "full", **(training or {})}
    return config_with(tmp, **sections, training=training, optimizer=optimizer)


def batch_mean_loss_config(tmp: Path) -> Path:
    """The tiny config with a user's loss that returns the batch's mean instead of one value per sample."""
    (tmp / "batch_mean.py").write_text(
        "import tensorflow as tf\n\n\ndef loss(y, p):\n    return tf.reduce_mean(tf.square(p))\n"
    )
    return tiny_config(tmp, loss={"name": "batch_mean:loss"})


def idx_config(tmp: Path, replace: str, raw: bytes) -> Path:
    """The tiny config reading a valid MNIST-like IDX folder, except that file ``replace`` holds ``raw``."""
    folder = tmp / "idx"
    write_idx_folder(folder)
    (folder / IDX_FILES[replace]).write_bytes(raw)
    return config_with(tmp, data={"name": "mnist", "path": str(folder)})


def with_empty_class(tmp: Path) -> Path:
    """Two classes of images and an empty third class folder."""
    folder = image_folder(tmp, "shapes", ["circle", "square"])
    (folder / "yellow_star").mkdir()
    return folder


def image_folder(tmp: Path, name: str, classes: list[str], suffix: str = "png") -> Path:
    """A folder ``name`` with two 8x8 images (or text files) per class in ``classes``."""
    from PIL import Image

    for label in classes:
        (tmp / name / label).mkdir(parents=True)
        for index in range(2):
            if suffix == "txt":
                (tmp / name / label / f"{index}.txt").write_text("not an image")
            else:
                Image.new("RGB", (8, 8), (index * 90, 40, 200)).save(tmp / name / label / f"{index}.{suffix}")
    return tmp / name


def empty_folder(tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def images_config(tmp: Path, **data: Any) -> Path:
    """The tiny config reading an image folder of two classes (classes a and b), with ``data`` keys set."""
    folder = image_folder(tmp, "images", ["a", "b"])
    settings = {"name": "image_folder", "path": str(folder), "image_size": [8, 8], "validation_split": 0.25, **data}
    return config_with(tmp, data={key: value for key, value in settings.items() if value is not None},
                       training={"epochs": 1, "batch_size": 2})  # fmt: skip


def records_config(tmp: Path, **data: Any) -> Path:
    """The tiny config reading TFRecord files of 6 images, with ``data`` keys set."""
    from accumrun.data.examples import write_tfrecords

    write_tfrecords(tmp / "shapes", count=6, size=8)
    settings = {"name": "tfrecord", "path": str(tmp / "shapes-*"), "image_size": [8, 8], **data}
    return config_with(tmp, data=settings, training={"epochs": 1, "batch_size": 2})


def csv_config(tmp: Path, text: str, label: str = "label") -> Path:
    """The tiny config reading a CSV file that holds ``text``."""
    (tmp / "table.csv").write_text(text)
    data = {"name": "csv", "path": str(tmp / "table.csv"), "label": label, "validation_split": 0}
    return config_with(tmp, data=data, training={"epochs": 1, "batch_size": 2})


def corpus_config(tmp: Path, text: str, sequence_length: int) -> Path:
    """The tiny config as a byte language model of ``text``, in windows of ``sequence_length``."""
    (tmp / "corpus.txt").write_text(text)
    data = {"name": "text_corpus", "path": str(tmp / "corpus.txt"), "sequence_length": sequence_length}
    return config_with(tmp, data=data, model={"name": "transformer", "layers": 1, "width": 8})


def sentence_piece_config(tmp: Path, vocabulary_size: int) -> Path:
    """The corpus config tokenized by a SentencePiece model of at most ``vocabulary_size`` ids, learned from a text
    of 29 characters (so 259 reserved ids + 29 at least)."""
    corpus_config(tmp, "The quick brown fox jumps over the lazy dog.\n" * 20, sequence_length=8)
    resolved = yaml.safe_load((tmp / "tiny.yaml").read_text())
    resolved["data"]["tokenizer"] = {"name": "sentence_piece", "vocabulary_size": vocabulary_size}
    return write_config(tmp / "tiny.yaml", **resolved)


def finished_run(tmp: Path) -> None:
    """A completed one-epoch tiny run in ``run``, to resume from."""
    result = invoke("train", str(tiny_config(tmp)), "--run-dir", str(tmp / "run"), "--epochs", "1", "--quiet")
    assert result.returncode == 0, f"the run to resume from failed: {result.stderr}"


def run_without_checkpoint(tmp: Path) -> None:
    """A run folder that failed before its first checkpoint: its config and status, nothing to resume from."""
    (tmp / "run" / "checkpoints").mkdir(parents=True)
    (tmp / "run" / "config.yaml").write_text(tiny_config(tmp).read_text())
    (tmp / "run" / "run.json").write_text('{"status": "failed", "started": "2026-11-24T00:00:00"}\n')


def interrupted_run(tmp: Path) -> None:
    """A run folder that a signal stopped after a checkpoint (its file's contents are not read by the refusal)."""
    run_without_checkpoint(tmp)
    (tmp / "run" / "run.json").write_text('{"status": "interrupted", "started": "2026-11-24T00:00:00"}\n')
    (tmp / "run" / "checkpoints" / "ckpt-epoch00001-batch0000001.npz").write_bytes(b"")


def row(
    name: str,
    build: Callable[[Path], object],
    exit_code: int,
    fragment: str,
    args: tuple[str, ...] = TRAIN,
    marks: Any = (),
) -> Any:
    """One row of the table, as a ``pytest.param`` whose id is ``name``."""
    return pytest.param(Case(name, build, args, exit_code, fragment), id=name, marks=marks)


RESUME_ARGS = ("train", "--resume", RUN_DIR)

# A table reads best with one row per entry, so the formatter leaves it as written.
CASES = [
    # --- resuming ---
    row("resume-config-differs", finished_run, 1, "differs", (*RESUME_ARGS, "--set", "model.hidden=[16]"),
        marks=pytest.mark.slow),
    row("resume-dir-missing", nothing, 2, "run: not a run folder (no run.json)", RESUME_ARGS),
    row("resume-no-checkpoint", run_without_checkpoint, 1,
        "no checkpoint to resume from; train it again with --overwrite", RESUME_ARGS),
    row("rerun-failed-without-checkpoint", run_without_checkpoint, 1,
        "holds a failed run with no checkpoint to resume; pass --overwrite to start it again"),
    row("rerun-interrupted", interrupted_run, 1,
        "output.run_dir: holds an interrupted run; continue it with --resume "),
    # --- a folder that is not a run: one rule and one wording for every command that takes one ---
    *(row(f"{command}-not-a-run", nothing, 2, "/run: not a run folder (no run.json)", (command, RUN_DIR, *extra))
      for command, extra in (("evaluate", ()), ("predict", ("x.png",)), ("export", ()), ("plot", ()))),
    row("predict-folder-without-run-json", lambda t: (t / "run").mkdir(), 2, "/run: not a run folder (no run.json)",
        ("predict", RUN_DIR, "x.png")),
    # --- the config file and its values: refused by load_config, before TensorFlow is imported ---
    row("config-missing", nothing, 1, "config file not found"),
    row("config-invalid-yaml", lambda t: write_text(t, "training:\n  epochs: 1\n   x: 3\n"), 1,
        "invalid YAML at line 3"),
    row("config-top-level-list", lambda t: write_text(t, "- 1\n- 2\n"), 1, "top level must be a mapping of sections"),
    row("config-unknown-section", lambda t: write_text(t, "trainig: {}\n"), 1, "did you mean 'training'?"),
    row("config-unknown-key", lambda t: tiny_config(t, training={"subdivsions": 2}), 1,
        "training.subdivsions: unknown key (did you mean 'subdivisions'?)"),
    row("config-wrong-type", lambda t: tiny_config(t, training={"epochs": "ten"}), 1,
        "training.epochs: input should be a valid integer (got 'ten')"),
    row("subdivisions-zero", lambda t: tiny_config(t, training={"subdivisions": 0}), 1,
        "training.subdivisions: must be a positive integer"),
    row("subdivisions-above-batch-size", lambda t: tiny_config(t, training={"batch_size": 4, "subdivisions": 5}), 1,
        "training.subdivisions: cannot exceed training.batch_size (4)"),
    row("batch-size-ful", lambda t: tiny_config(t, training={"batch_size": "ful"}), 1,
        "training.batch_size: must be a positive integer or 'full'"),
    row("epochs-zero", lambda t: tiny_config(t, training={"epochs": 0}), 1,
        "training.epochs: input should be greater than or equal to 1 (got 0)"),
    row("learning-rate-negative", lambda t: tiny_config(t, optimizer={"learning_rate": -0.01}), 1,
        "optimizer.learning_rate: must be a positive number"),
    row("model-unknown", lambda t: config_with(t, model={"name": "resnet"}), 1,
        "model.name: unknown model; use darknet_cnn, mlp, transformer, keras.applications.<Name>, "
        "keras_hub.models.<Name>Backbone, saved or 'package.module:function' (got 'resnet')"),
    row("dataset-unknown", lambda t: config_with(t, data={"name": "imagenet"}), 1,
        "data.name: input should be 'digits', 'npz', 'mnist', 'fashion_mnist', 'synthetic', 'image_folder', "
        "'tfrecord', 'csv', 'tfds', 'text_folder', 'text_corpus', 'jsonl' or 'tokens'"),
    row("digits-with-a-path", lambda t: config_with(t, data={"name": "digits", "path": str(t / "nowhere")}), 1,
        "data.path: is not used by data.name: digits"),
    row("set-unknown-key", tiny_config, 1, "training.subdivison: unknown key (did you mean 'subdivisions'?)",
        (*TRAIN, "--set", "training.subdivison=2")),
    row("set-through-a-value", tiny_config, 1, "--set seed.x cannot apply", (*TRAIN, "--set", "seed.x=1")),
    # --- L-BFGS: each key or setting that means nothing to it, in one line that says why ---
    row("lbfgs-batch-not-full", lambda t: tiny_config(t, optimizer={"name": "lbfgs"}), 1,
        "training.batch_size: lbfgs needs the exact full-batch gradient; set training.batch_size: full (got 10)"),
    row("lbfgs-schedule", lambda t: lbfgs_config(t, learning_rate={"name": "cosine_decay", "decay_steps": 9}), 1,
        "optimizer.learning_rate: a schedule has no meaning for L-BFGS, whose line search sets each step's length"),
    row("lbfgs-history-zero", lambda t: lbfgs_config(t, history=0), 1,
        "optimizer.history: input should be greater than or equal to 1 (got 0)"),
    row("lbfgs-negative-tolerance", lambda t: lbfgs_config(t, tolerance_change=-1e-9), 1,
        "optimizer.tolerance_change: input should be greater than or equal to 0 (got -1e-09)"),
    row("lbfgs-clipnorm", lambda t: lbfgs_config(t, clipnorm=1.0), 1,
        "optimizer.clipnorm: has no meaning for L-BFGS: a clipped gradient breaks the line search's Wolfe conditions"),
    row("lbfgs-reduce-on-plateau", lambda t: lbfgs_config(t, reduce_on_plateau={"monitor": "loss"}), 1,
        "optimizer.reduce_on_plateau: has no meaning for L-BFGS: L-BFGS's line search sets each step's length"),
    row("lbfgs-weight-decay", lambda t: lbfgs_config(t, weight_decay=0.01), 1,
        "optimizer.weight_decay: has no meaning for L-BFGS: decay outside the objective breaks the line search"),
    row("lbfgs-momentum", lambda t: lbfgs_config(t, momentum=0.9), 1, "optimizer.momentum: unknown key"),
    row("lbfgs-noise-scale", lambda t: lbfgs_config(t, training={"measure": ["noise_scale"]}), 1,
        "training.measure: the noise scale measures minibatch steps; lbfgs takes full-batch ones"),
    row("lbfgs-augment",
        lambda t: lbfgs_config(t, data={"name": "synthetic", "samples": 12, "shape": [8, 8, 1], "classes": 2,
                                        "augment": [{"name": "random_flip"}]}), 1,
        "data.augment: lbfgs needs the same objective at the same weights; augmentation draws anew every epoch"),
    row("lbfgs-mixed-precision", lambda t: lbfgs_config(t, training={"precision": "mixed_bfloat16"}), 1,
        "training.precision: lbfgs needs float32"),
    row("lbfgs-batch-norm-per-batch",
        lambda t: lbfgs_config(t, data={"name": "synthetic", "samples": 12, "shape": [8, 8, 1], "classes": 2},
                               model={"name": "darknet_cnn", "filters": [4], "strides": [2]}), 1,
        "training.batch_norm: lbfgs needs the same objective at the same weights; a model with BatchNorm takes "
        "frozen only (got 'per_batch')"),
    # --- refused by `train` once the data or Keras can judge: each stage that runs before the run folder is made ---
    row("batch-size-above-dataset", lambda t: tiny_config(t, training={"batch_size": 50}), 1,
        "training.batch_size: is larger than the 23 training samples; use batch_size: full"),
    row("optimizer-unknown", lambda t: tiny_config(t, optimizer={"name": "adma"}), 1,
        "optimizer.name: unknown optimizer; did you mean 'Adam'?"),
    row("optimizer-keyword-it-does-not-take", lambda t: tiny_config(t, optimizer={"momentum": 0.9}), 1,
        "optimizer.momentum: Adam has no such argument"),
    row("flat-vectors-into-darknet-cnn", lambda t: config_with(t, model={"name": "darknet_cnn"}), 1,
        "darknet_cnn needs image samples of shape (height, width, channels) (got (4,))"),
    row("npz-missing", lambda t: config_with(t, data={"name": "npz", "path": str(t / "absent.npz")}), 1,
        "data.path: npz file not found"),
    row("npz-without-y", lambda t: npz_config(t, x=X, labels=Y), 1,
        "needs arrays 'x' and 'y' (or 'x_train' and 'y_train'); it has ['labels', 'x']"),
    row("npz-length-mismatch", lambda t: npz_config(t, x=X, y=Y[:5]), 1, "data.y_train: has 5 labels for 6 samples"),
    row("labels-negative", lambda t: npz_config(t, x=X, y=Y - 1), 1, "data.y_train: labels must be >= 0 (got -1)"),
    row("labels-float", lambda t: npz_config(t, "classification", x=X, y=Y + 0.5), 1,
        "data.y_train: labels must be integer class indices (got 0.5)"),
    # --- models, losses and metrics: refused once Keras can judge, before the run folder is made ---
    row("application-unknown", lambda t: config_with(t, model={"name": "keras.applications.MobilNetV2"}), 1,
        "model.name: unknown keras application; did you mean 'MobileNetV2'? (got 'MobilNetV2')"),
    row("application-input-too-small",
        lambda t: config_with(t, data={"name": "synthetic", "samples": 26, "shape": [16, 16, 3]},
                              model={"name": "keras.applications.MobileNetV2", "alpha": 0.35}), 1,
        "model: MobileNetV2 refused input shape (16, 16, 3): Input size must be at least 32x32"),
    row("saved-model-missing", lambda t: config_with(t, model={"name": "saved", "path": str(t / "absent.keras")}), 1,
        "model.path: saved model not found"),
    row("saved-model-not-keras",
        lambda t: ((t / "notes.keras").write_text("not a model"),
                   config_with(t, model={"name": "saved", "path": str(t / "notes.keras")})), 1,
        "model.path: cannot load as a Keras model"),
    row("output-too-narrow-for-the-labels", lambda t: saved_model_config(t, outputs=2), 1,
        "model: class labels 0..2 need an output of shape (3,), one unit per class; the model outputs (2,)"),
    row("loss-unknown", lambda t: tiny_config(t, loss={"name": "hubber"}), 1,
        "loss.name: unknown loss; did you mean 'Huber'? (got 'hubber')"),
    row("metric-unknown", lambda t: tiny_config(t, metrics=["acuracy"]), 1,
        "metrics[0]: unknown metric; did you mean 'Accuracy'? (got 'acuracy')"),
    row("float-targets-with-a-class-label-loss",
        lambda t: npz_config(t, loss={"name": "sparse_categorical_crossentropy"}, x=X, y=Y + 0.5), 1,
        "loss.name: sparse_categorical_crossentropy takes integer class labels, but the targets are regression"),
    row("float-targets-without-a-loss", lambda t: npz_config(t, x=X, y=Y + 0.5), 1,
        "loss.name: regression targets of shape (1,) need a loss; set loss: {name: mean_squared_error}"),
    row("loss-without-per-sample-values", batch_mean_loss_config, 1,
        "batch_mean:loss returned shape () for 2 samples; accumrun needs one value per sample"),
    row("dataset-empty", lambda t: npz_config(t, x=np.zeros((0, 4)), y=np.zeros(0, dtype=int)), 1,
        "data.x_train: is empty"),
    row("idx-bad-magic", lambda t: idx_config(t, "x_train", gzip.compress(b"\x00\x00\x0d" + idx_bytes(IMAGES)[3:])), 1,
        "train-images-idx3-ubyte.gz is not an IDX file of unsigned bytes (bad magic number)"),
    row("idx-truncated", lambda t: idx_config(t, "x_train", gzip.compress(idx_bytes(IMAGES)[:-5])), 1,
        "train-images-idx3-ubyte.gz holds 31 data bytes; its header (6, 3, 2) needs 36"),
    # --- bad usage: exit 2 with the usage line, before anything is read ---
    row("usage-batch-size-zero", tiny_config, 2, "'0' is neither a positive integer nor 'full'",
        (*TRAIN, "--batch-size", "0")),
    row("usage-subdivisions-zero", tiny_config, 2, "Invalid value for '--subdivisions'",
        (*TRAIN, "--subdivisions", "0")),
    row("usage-subdivisions-and-no-subdivisions", tiny_config, 2, "exclude each other",
        (*TRAIN, "--subdivisions", "2", "--no-subdivisions")),
    row("usage-unknown-option", tiny_config, 2, "Did you mean '--epochs'?", (*TRAIN, "--epoch", "3")),
    row("usage-config-is-a-folder", lambda t: (t / "tiny.yaml").mkdir(), 2, "is a directory"),
    row("usage-set-without-equals", tiny_config, 2, "'training.subdivisions' is not KEY=VALUE",
        (*TRAIN, "--set", "training.subdivisions")),
    # --- files that stream: refused at startup, before the run folder is made ---
    row("image-folder-missing", lambda t: images_config(t, path=str(t / "absent")), 1,
        "data.path: folder not found"),
    row("image-folder-empty", lambda t: images_config(t, path=str(empty_folder(t))), 1,
        "data.path: holds no class subfolders"),
    row("image-folder-one-class", lambda t: images_config(t, path=str(image_folder(t, "one", ["a"]))), 1,
        "holds one class (a); classification needs at least two"),
    row("image-folder-empty-class", lambda t: images_config(t, path=str(with_empty_class(t))), 1,
        "data.path: class folder yellow_star/ holds no images"),
    row("image-folder-classes-differ",
        lambda t: images_config(t, validation_split=0, validation_path=str(image_folder(t, "val", ["a", "c"]))), 1,
        "data.validation_path: has classes [a, c], data.path has [a, b]; they must be the same"),
    row("image-folder-no-images", lambda t: images_config(t, path=str(image_folder(t, "texts", ["a", "b"], "txt"))),
        1, "holds no images (.png, .jpg, .jpeg, .bmp, .gif)"),
    row("image-size-not-two-integers", lambda t: images_config(t, image_size=[0, 8]), 1,
        "data.image_size: must be two positive integers [height, width] (got [0, 8])"),
    row("image-size-missing", lambda t: images_config(t, image_size=None), 1,
        "data.image_size: data.name: image_folder needs [height, width]"),
    row("augment-unknown", lambda t: images_config(t, augment=[{"name": "random_flipp"}]), 1,
        "data.augment[0].name: unknown augmentation layer; did you mean 'RandomFlip'? (got 'random_flipp')"),
    row("augment-crop-larger-than-the-image",
        lambda t: images_config(t, augment=[{"name": "random_crop", "height": 9, "width": 9}]), 1,
        "RandomCrop takes 9x9 crops of 8x8 images; the images are too small"),
    row("tfrecord-key-missing", lambda t: records_config(t, image_key="image/jpeg"), 1,
        "data.image_key: "),
    row("tfrecord-no-files", lambda t: records_config(t, path=str(t / "none-*")), 1,
        "data.path: no TFRecord file matches"),
    row("csv-label-missing", lambda t: csv_config(t, "a,b,label\n1,2,0\n3,4,1\n", label="target"), 1,
        "has no column 'target'; its columns are ['a', 'b', 'label']"),
    row("csv-non-numeric-cell", lambda t: csv_config(t, "a,b,label\n1,2,0\n3,x,1\n"), 1,
        "row 3, column 'b': not a number (got 'x')"),
    row("corpus-shorter-than-a-window", lambda t: corpus_config(t, "ten bytes.", sequence_length=64), 1,
        "data.path: the text is shorter than one window: 10 tokens, and a window takes data.sequence_length + 1 = 65"),
    row("corpus-window-absurd", lambda t: corpus_config(t, "a short text " * 40, sequence_length=100_000), 1,
        "the text is shorter than one window: 520 tokens, and a window takes data.sequence_length + 1 = 100,001"),
    row("sentence-piece-vocabulary-below-its-reserved-ids", lambda t: sentence_piece_config(t, 100), 1,
        "data.tokenizer.vocabulary_size: input should be greater than or equal to 260 (got 100)"),
    row("sentence-piece-vocabulary-too-small-for-the-text", lambda t: sentence_piece_config(t, 270), 1,
        "data.tokenizer.vocabulary_size: too small for the training texts: it needs at least 288 ids, 259 reserved "
        "(padding, unknown, the line break, 256 bytes) and 29 for the texts' characters (got 270)"),
]  # fmt: skip


# --- running the rows -----------------------------------------------------------------------------------------


def snapshot(folder: Path) -> list[tuple[str, int, int]] | None:
    """Every path under ``folder`` with its size and modification time, or None when the folder does not exist."""
    if not folder.exists():
        return None
    return sorted(
        (str(path.relative_to(folder)), path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")
    )


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_cleanly(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case.build(tmp_path)
    monkeypatch.chdir(tmp_path)
    run_dir = Path(RUN_DIR.format(tmp=tmp_path))
    before = snapshot(run_dir)
    result = invoke(*(arg.format(tmp=tmp_path) for arg in case.args))
    stderr = result.stderr
    assert result.returncode == case.exit_code, stderr
    assert case.fragment.lower() in stderr.lower()
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    if case.exit_code == 2:
        assert lines[0].startswith("Usage: "), stderr
        assert [line for line in lines if line.startswith("Error:")] == [lines[-1]], stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    # Absent stays absent; a run folder that was there (to resume from) is left exactly as it was.
    assert snapshot(run_dir) == before, "the run folder was changed"


# --- on the API: faults whose path to the user a row above already proves -------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"not a zip", "data.path: cannot read as .npz: not a zip of arrays", id="not-an-archive"),
        pytest.param(b"", "data.path: cannot read as .npz: not a zip of arrays", id="empty-file"),
        pytest.param(
            {"x": X, "y": np.array(list("abcabc"))},
            "data.y_train: labels must be integer class indices (got 'a')",
            id="labels-text",
        ),
        pytest.param({"x": X + 1j, "y": Y}, "data.x_train: samples must be real numbers", id="samples-complex"),
    ],
)
def test_npz_fault_is_a_data_error(tmp_path: Path, content: bytes | dict[str, np.ndarray], message: str) -> None:
    # Each of these once escaped as an unexpected TypeError or EOFError, a Python warning, or numpy's advice to
    # load the file as an unsafe pickle.
    path = tmp_path / "data.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.savez(path, **content)
    with pytest.raises(DataError) as info:
        load_dataset(data_config(name="npz", path=str(path)), seed=0)
    assert message in info.value.message


@pytest.mark.parametrize(
    "keywords",
    [
        # Keras keeps the string; training then fails inside the compiled step, after the run folder is made.
        pytest.param({"beta_1": "abc"}, id="beta_1-text"),
        # Keras accepts it and then clips only when clipnorm > 0: the run trains unclipped, and nothing says so.
        pytest.param({"clipnorm": -1.0}, id="clipnorm-negative"),
    ],
)
def test_optimizer_keyword_value_is_checked(keywords: dict[str, Any]) -> None:
    from accumrun.optim import build_optimizer  # imports Keras, so only when this test runs

    (key,) = keywords
    with pytest.raises(ConfigError, match=rf"^optimizer\.{key}: must be (a number|> 0)"):
        build_optimizer(OptimizerConfig.model_validate({"name": "adam", **keywords}))
