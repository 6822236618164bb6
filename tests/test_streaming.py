"""Data that streams: image folders, TFRecord and CSV files made in tmp_path, read through the one feeder.

They prove the promises of the in-memory path hold for files too: subdivided == plain on an uneven split, with
whole batches or streamed sub-batches and augmentation that crops, rotates and flips; the same seed gives the same
run; a resumed run equals an uninterrupted one; augmentation does not depend on the subdivisions; uint8 stays uint8
until the model's input layers.

Tolerance of subdivided against plain training (``TOLERANCE``, 1e-5): both runs take the same 6 SGD updates
(learning rate ``LEARNING_RATE``, 0.1) from the same weights on the same augmented images, and a sample's forward
pass is its own row of the same products; they differ only in how the gradient's sum over a batch's samples is
grouped (one sum of up to 10 terms, or sums of up to 4 combined by their sizes: at most n = 12 additions). Each
term is a pixel in [0, 1] times a back-propagated error of at most 3 (the softmax's error is at most 1 a class,
through output weights below 1), so the mean's terms sum to at most 3 in size, and Higham's bound puts each
run's gradient within n * 2^-24 * 3 = 2.2e-6 of the exact one: 4.3e-6 between the runs. Six updates at 0.1 carry
at most 2.6e-6 into a weight, and the 1e-5 leaves a factor of 4 for its propagation through the later updates;
the losses, means of per-sample losses whose gradients are below 3, move less. A resumed run repeats the same
operations on the same numbers: exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from numpy.testing import assert_array_equal

from accumrun import load_config, train
from accumrun.config.loading import load_resume_config
from accumrun.config.schema import data_config
from accumrun.data.augment import Augmentation
from accumrun.data.dataset import load_dataset
from accumrun.data.examples import encode, shape_images, write_csv, write_image_folder, write_tfrecords
from accumrun.data.feeder import Feeder
from accumrun.data.section import AugmentConfig, DataSection
from accumrun.data.source import ArraySource
from accumrun.errors import ConfigError, DataError, Interrupted
from accumrun.training.runner import RunResult
from accumrun.training.setup import build_training
from tests.helpers import Trained, assert_close, invoke, signal_after_batch

SIZE = 8
LEARNING_RATE = 0.1
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """23 PNG images of 8x8 in three classes, plus a file that is not an image."""
    root = write_image_folder(tmp_path_factory.mktemp("images") / "shapes", count=23, size=SIZE, seed=1)
    (root / "bars" / "notes.txt").write_text("not an image")
    return root


AUGMENT = [
    {"name": "random_crop", "height": 6, "width": 6},
    {"name": "random_rotation", "factor": 0.1},
    {"name": "random_flip", "mode": "horizontal"},
]
"""A crop that changes the size, a rotation and a flip, each drawn per sample and epoch."""


def image_config(folder: Path, **data: Any) -> dict[str, Any]:
    """A fast run on the image folder, validated on a second folder (the same one): an MLP (no BatchNorm) on
    augmented 6x6 crops, batch 10 split 3 ways, a short last batch of 3 (sub-batches of 1)."""
    return {
        "seed": 5,
        "data": {
            "name": "image_folder",
            "path": str(folder),
            "image_size": [SIZE, SIZE],
            "validation_split": 0,
            "validation_path": str(folder),
            "augment": AUGMENT,
        }
        | data,
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 3},
        "optimizer": {"name": "sgd", "learning_rate": LEARNING_RATE},
        "output": {"tensorboard": False},
    }


def weights(result: Any) -> list[np.ndarray]:
    return [v.numpy() for v in result.model.variables]


def plain_config(folder: Path) -> dict[str, Any]:
    """:func:`image_config` in whole batches, not subdivided: the run the subdivided ones must equal."""
    return image_config(folder, feed="batch") | {"training": {"epochs": 2, "batch_size": 10, "subdivisions": 1}}


# --- the image folder ------------------------------------------------------------------------------------------


def test_an_image_folder_lists_classes_in_order_and_counts_what_it_skips(folder: Path) -> None:
    dataset = load_dataset(data_config(name="image_folder", path=str(folder), image_size=[SIZE, SIZE]), seed=0)
    assert dataset.class_names == ["bars", "columns", "disc"] and dataset.classes == 3
    assert dataset.skipped == 1
    assert dataset.train_size + dataset.val_size == 23 and dataset.val_size == 2
    assert dataset.dtype == np.uint8 and dataset.sample_shape == (SIZE, SIZE, 3)
    assert dataset.scale == 1 / 255


@pytest.mark.parametrize("fmt", ["png", "jpeg", "bmp", "gif"])
def test_each_image_format_decodes_resized_to_image_size(tmp_path: Path, fmt: str) -> None:
    from PIL import Image

    images, _ = shape_images(2, 12, seed=0)
    for label, image in zip(("a", "b"), images, strict=True):
        (tmp_path / label).mkdir()
        Image.fromarray(image).save(tmp_path / label / f"x.{fmt}")
    for color_mode, channels in (("rgb", 3), ("grayscale", 1)):
        config = data_config(
            name="image_folder", path=str(tmp_path), image_size=[6, 5], color_mode=color_mode, validation_split=0
        )
        dataset = load_dataset(config, seed=0)
        x, y = next(iter(Feeder(dataset.train, [2], seed=0, shuffle=False).epoch(0)))
        assert x.dtype == tf.uint8 and tuple(x.shape) == (2, 6, 5, channels)
        assert y.numpy().tolist() == [0, 1]
    if fmt == "png":  # lossless: at its own size, the decoded image is the file's
        same = data_config(name="image_folder", path=str(tmp_path), image_size=[12, 12], validation_split=0)
        x, _ = next(iter(Feeder(load_dataset(same, seed=0).train, [2], seed=0, shuffle=False).epoch(0)))
        np.testing.assert_array_equal(x.numpy(), images)


@pytest.mark.slow
@pytest.mark.parametrize("feed", ["batch", "sub_batch"])
def test_subdivided_training_on_an_image_folder_equals_plain_training(
    folder: Path, trained: Trained, feed: str
) -> None:
    # 23 training images in batches of 10, 10 and 3; 3 sub-batches of 4, 3, 3 (and of 1, 1, 1). The crop, rotation
    # and flip of each image are drawn for it alone, so the subdivisions do not change them.
    plain = trained("plain", plain_config(folder))
    subdivided = trained(feed, image_config(folder, feed=feed))
    assert_close(weights(plain), weights(subdivided), atol=TOLERANCE)
    for a, b in zip(plain.metrics, subdivided.metrics, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=TOLERANCE)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=TOLERANCE)
        assert a["optimizer_steps"] == b["optimizer_steps"] == 3 * a["epoch"]
    assert subdivided.model.input_shape == (None, 6, 6, 3)  # the model trains on the crops
    saved = load_config(subdivided.run_dir / "config.yaml")
    assert (saved.data.feed, saved.data.rescale) == (feed, 1 / 255)
    assert (saved.data.validation_path, saved.data.validation_split) == (str(folder), 0.0)


def test_the_saved_model_takes_the_folders_images_and_crops_their_centre(folder: Path, trained: Trained) -> None:
    # model.keras takes the folder's 8x8 images and crops their centre, as validation does: the same float32 ops on
    # the same numbers as the trained model on the centres, so the same logits to the bit.
    result = trained("sub_batch", image_config(folder, feed="sub_batch"))
    saved = keras.models.load_model(result.run_dir / "model.keras")
    assert saved.input_shape == (None, SIZE, SIZE, 3)
    images = shape_images(4, SIZE, seed=9)[0]
    np.testing.assert_array_equal(saved(images).numpy(), result.model(images[:, 1:7, 1:7, :]).numpy())


def test_another_seed_gives_another_order(folder: Path) -> None:
    # That the same seed gives the same run, flips and order included, is the resume test's below: its stopped run
    # is a second run of the config, and ends with the uninterrupted one's weights and losses, bit for bit.
    order = [
        Feeder(
            load_dataset(data_config(name="image_folder", path=str(folder), image_size=[SIZE, SIZE]), seed).train,
            [21],
            seed=seed,
            shuffle=True,
        )
        for seed in (5, 6)
    ]
    x5, x6 = (next(iter(feeder.epoch(0)))[0].numpy() for feeder in order)
    assert not np.array_equal(x5, x6)


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_to_the_same_weights(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained: Trained
) -> None:
    # The whole path once (streamed sub-batches, augmentation, a second folder to validate on, checkpoint, resume);
    # that every kind of source's stream continues from a skip as it would have run on is tests/test_sources.py's.
    # The stopped run is a second run of the same config from the same seed: the same order and draws, or the
    # weights would differ.
    config = image_config(folder, feed="sub_batch")
    reference = trained("sub_batch", config)
    signal_after_batch(monkeypatch, 5)  # the middle batch of epoch 2 (of 2), so the resume skips into an epoch > 0
    with pytest.raises(Interrupted):
        train(config, tmp_path / "run", quiet=True)
    monkeypatch.undo()
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"
    # The resumed run reloads its saved config, the second folder included: it validates there as the reference did.
    resumed = train(load_resume_config(tmp_path / "run", None), tmp_path / "run", quiet=True, resume=True)
    assert_close(weights(resumed), weights(reference), atol=0)
    assert [row["loss"] for row in resumed.metrics] == [row["loss"] for row in reference.metrics]
    assert [row["epoch"] for row in resumed.metrics] == [1, 2]
    assert resumed.metrics[-1]["val_loss"] == reference.metrics[-1]["val_loss"] > 0


# --- augmentation ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_augmentation_is_drawn_per_sample_and_epoch_not_per_chunk() -> None:
    images, labels = shape_images(10, 12, seed=0)
    augmentation = Augmentation(
        [AugmentConfig(name="random_crop", height=9, width=9), AugmentConfig(name="random_flip")],
        (12, 12, 3),
        np.dtype(np.uint8),
    )
    assert augmentation.output_shape == (9, 9, 3)
    split = ArraySource(images, labels)

    def epoch(chunks: list[int], number: int) -> np.ndarray:
        feeder = Feeder(split, chunks, seed=3, shuffle=True, augmentation=augmentation)
        return np.concatenate([x.numpy() for x, _ in feeder.epoch(number)])

    whole = epoch([10], 0)
    assert whole.dtype == np.uint8 and whole.shape == (10, 9, 9, 3)
    np.testing.assert_array_equal(whole, epoch([4, 3, 3], 0))  # the sub-batches see the same samples
    np.testing.assert_array_equal(whole, epoch([10], 0))  # and again
    assert not np.array_equal(whole, epoch([10], 1))  # another epoch, other draws
    # Inference mode crops the centre, for validation.
    feeder = Feeder(split, [10], seed=3, shuffle=False, augmentation=augmentation, training=False)
    centre = next(iter(feeder.epoch(0)))[0].numpy()
    np.testing.assert_array_equal(centre, images[:, 1:10, 1:10, :])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "random_flipp"},
            r"data\.augment\[0\]\.name: unknown augmentation layer; did you mean 'RandomFlip'\?",
        ),
        (
            {"name": "random_crop", "height": 20, "width": 4},
            r"data\.augment\[0\]: RandomCrop takes 20x4 crops of 8x8 images",
        ),
        ({"name": "random_flip", "direction": "up"}, r"data\.augment\[0\]\.direction: RandomFlip has no such argument"),
        ({"name": "rand_augment"}, r"data\.augment\[0\]: RandAugment ignores the seed it is given"),
    ],
)
def test_bad_augmentation_is_refused(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Augmentation([AugmentConfig(**entry)], (8, 8, 3), np.dtype(np.uint8))


# --- compact storage -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uint8_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], RunResult]:
    """An MLP trained for an epoch on 12 uint8 images of 6x6 in an npz file: the file, the config and the run,
    trained once for the tests that read it."""
    folder = tmp_path_factory.mktemp("uint8")
    images, labels = shape_images(12, 6, seed=0)
    np.savez(folder / "d.npz", x=images, y=labels)
    config = {
        "data": {"name": "npz", "path": str(folder / "d.npz"), "validation_split": 0},
        "model": {"name": "mlp", "hidden": [4]},
        "training": {"epochs": 1, "batch_size": 4},
    }
    return folder / "d.npz", config, train(config | {"output": {"tensorboard": False}}, folder / "run", quiet=True)


@pytest.mark.slow
def test_uint8_stays_uint8_on_the_host_and_is_scaled_inside_the_model(
    uint8_run: tuple[Path, dict[str, Any], RunResult],
) -> None:
    path, _, result = uint8_run
    images = shape_images(12, 6, seed=0)[0]
    dataset = load_dataset(data_config(name="npz", path=str(path), validation_split=0), seed=0)
    assert dataset.train.x.dtype == np.uint8 and dataset.train.x.nbytes == images.nbytes
    x, _ = next(iter(Feeder(dataset.train, [4], seed=0, shuffle=False).epoch(0)))
    assert x.dtype == tf.uint8
    model = result.model
    assert model.inputs[0].dtype == "uint8"
    # The inner network is given the bytes scaled by 1/255 in float32 (Rescaling's x * float32(1 / 255) + 0: each
    # operation rounds once, as NumPy's does): to the bit, on any CPU.
    assert_array_equal(scaled_input(model, images[:3]), images[:3].astype(np.float32) * np.float32(1 / 255))
    reloaded = keras.models.load_model(result.run_dir / "model.keras")
    # The same layers and weights on the same bytes: the same float32 operations, so the same logits to the bit.
    np.testing.assert_array_equal(reloaded(images[:3]).numpy(), model(images[:3]).numpy())


def test_normalize_applies_per_channel_after_rescale(tmp_path: Path) -> None:
    images, labels = shape_images(6, 4, seed=0)
    np.savez(tmp_path / "d.npz", x=images, y=labels)
    config = {
        "data": {
            "name": "npz",
            "path": str(tmp_path / "d.npz"),
            "validation_split": 0,
            "normalize": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.5]},
        },
        "model": {"name": "mlp", "hidden": [4]},
        "training": {"epochs": 1, "batch_size": 6},
        "output": {"tensorboard": False},
    }
    # The model a run trains, as built (the input layers are the model's, trained or not): no training needed.
    model = build_training(load_config(config)).trained.model
    # Normalization's (x - mean) / sqrt(variance) with its float32 weights (the variance std**2 squared in float64,
    # then stored), each operation rounded once as NumPy's float32 operations are: the inner network's input to the
    # bit, on any CPU.
    mean = np.float32([0.5, 0.4, 0.3])
    std = np.sqrt(np.float32(np.array([0.2, 0.25, 0.5]) ** 2))
    rescaled = images.astype(np.float32) * np.float32(1 / 255)
    assert_array_equal(scaled_input(model, images), (rescaled - mean) / std)


def scaled_input(model: keras.Model, images: np.ndarray) -> np.ndarray:
    """What ``model``, a raw input and its scaling layers before its inner network, gives that network for
    ``images``: the last scaling layer's output."""
    return keras.Model(model.inputs[0], model.layers[-2].output)(images).numpy()  # type: ignore[no-any-return]


# --- TFRecord --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> str:
    files = write_tfrecords(tmp_path_factory.mktemp("records") / "shapes", count=23, size=SIZE, seed=2, shards=3)
    return str(files[0].parent / "shapes-*")


def record_config(pattern: str, **data: Any) -> DataSection:
    return data_config(name="tfrecord", path=pattern, image_size=[SIZE, SIZE], shuffle_buffer=8, **data)


def test_tfrecord_records_are_numbered_through_the_sorted_shards_and_ordered_by_the_seed(records: str) -> None:
    # That an epoch visits every record once, in the same order for a seed and epoch, another order in another
    # epoch, and from a skip reads on, is the contract over every source's (tests/test_sources.py's).
    dataset = load_dataset(record_config(records), seed=0)
    assert (dataset.train_size, dataset.val_size, dataset.classes) == (21, 2, 3)
    reader = dataset.train
    held_out = set(dataset.val.stream(0, 0, False).map(lambda i, x, y: i).as_numpy_iterator())

    def order(seed: int) -> list[tuple[int, np.ndarray, int]]:
        return [(int(i), x, int(y)) for i, x, y in reader.stream(0, seed, True).as_numpy_iterator()]

    first = order(0)
    assert sorted(i for i, _, _ in first) == sorted(set(range(23)) - held_out)
    assert [i for i, _, _ in order(1)] != [i for i, _, _ in first]  # another seed, another order
    # Records are numbered through the sorted files; shard k holds images k, k + 3, ...
    images, labels = shape_images(23, SIZE, seed=2)
    image_of_record = [i for shard in range(3) for i in range(shard, 23, 3)]
    for index, x, y in first:
        np.testing.assert_array_equal(x, images[image_of_record[index]])
        assert y == labels[image_of_record[index]]


def test_make_example_tfrecord_prints_a_path_that_trains(tmp_path: Path) -> None:
    target = tmp_path / "shapes"
    made = invoke("make-example", "tfrecord", str(target), "--count", "12", "--size", "8")
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [
        "wrote 12 images to 2 shards, shapes-00000-of-00002 to shapes-00001-of-00002",
        f"train on them with data.path: {target}",
    ]
    # The bare name finds its shards, and only them; a name with no shards is still refused.
    (tmp_path / "shapes-notes.txt").write_text("not a record")
    dataset = load_dataset(data_config(name="tfrecord", path=str(target), image_size=[8, 8]), seed=0)
    assert dataset.train_size + dataset.val_size == 12
    with pytest.raises(DataError, match=r"data\.path: no TFRecord file matches"):
        load_dataset(data_config(name="tfrecord", path=str(tmp_path / "shape"), image_size=[8, 8]), seed=0)


def test_a_missing_tfrecord_key_names_the_keys_the_file_has(records: str) -> None:
    with pytest.raises(
        DataError,
        match=r"data\.image_key: .* has no feature 'jpeg'; its features are \['image/class/label', 'image/encoded'\]",
    ):
        load_dataset(record_config(records, image_key="jpeg"), seed=0)


# --- CSV -------------------------------------------------------------------------------------------------------


def test_csv_reads_numeric_features_and_names_text_labels(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", count=30, features=4)
    dataset = load_dataset(data_config(name="csv", path=str(path), label="species", validation_split=0), seed=0)
    assert dataset.sample_shape == (4,) and dataset.dtype == np.float32  # the id column is not a feature
    assert dataset.class_names == ["adelie", "chinstrap", "gentoo"] and dataset.task == "classification"
    first = path.read_text().splitlines()[1].split(",")
    # float32 holds each number to within its rounding, 2^-24 = 6e-8 relative.
    np.testing.assert_allclose(dataset.train.x[0], [float(v) for v in first[1:5]], rtol=2.0**-24)
    assert dataset.class_names[dataset.train.y[0]] == first[5]


def test_several_csv_label_columns_are_multi_label_or_regression_targets(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("x1,cat,x2,dog,fish,size\n0.5,1,2,0,1,3.5\n1.5,0,1,1,0,2.25\n2.5,1,0,1,1,1.0\n")
    tagged = load_dataset(data_config(name="csv", path=str(path), label=["cat", "dog", "fish"], validation_split=0), 0)
    assert tagged.task == "multi_label" and tagged.labels == ["cat", "dog", "fish"]
    np.testing.assert_array_equal(tagged.train.y, [[1, 0, 1], [0, 1, 0], [1, 1, 1]])
    assert tagged.sample_shape == (3,)  # x1, x2 and size: every numeric column that is no label
    measured = load_dataset(data_config(name="csv", path=str(path), label=["x2", "size"], validation_split=0), 0)
    assert measured.task == "regression" and measured.labels is None and measured.target_shape == (2,)
    np.testing.assert_allclose(measured.train.y[:, 1], [3.5, 2.25, 1.0])
    with pytest.raises(DataError, match=r"data\.label: .* has no column 'bird'"):
        load_dataset(data_config(name="csv", path=str(path), label=["cat", "bird"], validation_split=0), 0)
    with pytest.raises(DataError, match=r"data\.id: .* has no column 'name'"):
        load_dataset(data_config(name="csv", path=str(path), label="cat", id="name", validation_split=0), 0)


def test_csv_faults_name_the_file_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,x,1\n")
    with pytest.raises(DataError, match=r"t\.csv, row 3, column 'b': not a number \(got 'x'\)"):
        load_dataset(data_config(name="csv", path=str(path), label="label", validation_split=0), seed=0)
    with pytest.raises(
        DataError, match=r"data\.label: .* has no column 'target'; its columns are \['a', 'b', 'label'\]"
    ):
        load_dataset(data_config(name="csv", path=str(path), label="target", validation_split=0), seed=0)


def test_an_undecodable_image_names_its_file(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "images", count=6, size=SIZE)
    broken = folder / "disc" / "00005.png"
    broken.write_bytes(b"\x89PNG but not really")
    dataset = load_dataset(
        data_config(name="image_folder", path=str(folder), image_size=[SIZE, SIZE], validation_split=0), seed=0
    )
    feeder = Feeder(dataset.train, [3, 3], seed=0, shuffle=True)
    with pytest.raises(DataError, match=rf"{broken} does not decode as an image"):
        list(feeder.epoch(0))
    assert encode(np.zeros((2, 2, 3), np.uint8))[:4] == b"\x89PNG"


# --- the command line ------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def test_every_example_config_loads() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


@pytest.mark.slow
def test_the_image_folder_example_trains_as_documented(tmp_path: Path) -> None:
    # 120 images: 96 to train on, two batches of the config's 48 (one shape: the step is traced once).
    made = invoke("make-example", "images", str(tmp_path / "shapes"), "--count", "120", "--size", "32")
    assert made.returncode == 0, made.stderr
    again = invoke("make-example", "images", str(tmp_path / "shapes"))
    assert again.returncode == 1 and "already exists" in again.stderr
    config = REPO / "configs" / "image_folder.yaml"
    run = tmp_path / "run"
    trained = invoke(
        "train", str(config), "--run-dir", str(run), "--epochs", "1", "--set", f"data.path={tmp_path / 'shapes'}"
    )
    assert trained.returncode == 0, trained.stderr
    assert "input uint8 streamed from files" in trained.stdout and "feed batch" in trained.stdout
    assert json.loads((run / "labels.json").read_text()) == ["bars", "columns", "disc"]
    # Trained on 28x28 random crops, the saved model takes 32x32 images as the folder holds them, as validation did.
    assert keras.models.load_model(run / "model.keras").input_shape == (None, 32, 32, 3)


@pytest.mark.slow
def test_an_image_that_does_not_decode_stops_the_run_naming_it(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "images", count=12, size=SIZE)
    broken = folder / "columns" / "00007.png"
    broken.write_bytes(b"not a png at all")
    config = image_config(folder, validation_split=0)
    config["training"]["batch_size"] = 4
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = invoke("train", str(path), "--run-dir", str(tmp_path / "run"), "--quiet")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"Error: data: {broken} does not decode as an image ({lines[0].split('(', 1)[1]}"]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"
    assert not (tmp_path / "run" / "model.keras").exists()


def test_a_rescale_of_zero_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"data\.rescale: must be 'auto', false, or a positive factor"):
        load_config({"data": {"rescale": 0}})


@pytest.mark.slow
def test_a_saved_accumrun_model_keeps_its_own_input_layers(uint8_run: tuple[Path, dict[str, Any], RunResult]) -> None:
    _, config, result = uint8_run
    images = shape_images(12, 6, seed=0)[0]
    saved = keras.models.load_model(result.run_dir / "model.keras")
    path = str(result.run_dir / "model.keras")
    again = build_training(load_config(config | {"model": {"name": "saved", "path": path}}))
    # Not wrapped in a second rescale: the raw bytes reach the saved model's own input layers once.
    assert again.trained.model.inputs[0].dtype == "uint8"
    # The same layers and weights on the same bytes: the same logits to the bit.
    np.testing.assert_array_equal(again.trained.model(images).numpy(), saved(images).numpy())
