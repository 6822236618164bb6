"""The data layer: loaders, file-format errors, the validation split and the per-epoch order (no TensorFlow)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from accumrun.config.schema import data_config
from accumrun.data import arrays, dataset, registry
from accumrun.data.registry import DATA_SECTIONS
from accumrun.data.tables import CsvConfig
from accumrun.errors import ConfigError, DataError
from accumrun.kinds import Task
from tests.helpers import idx_bytes, write_idx, write_idx_folder


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def unique_rows(samples: int, features: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Samples whose first feature is their index, so every row is distinct and traceable."""
    x = np.zeros((samples, features), dtype=np.float32)
    x[:, 0] = np.arange(samples)
    x[:, 1:] = np.arange(samples)[:, None] * 10 + np.arange(1, features)
    y = (np.arange(samples) % 4).astype(np.int64)
    return x, y


def load_npz(path: Path, seed: int = 0, **config: object) -> dataset.Dataset:
    return dataset.load_dataset(data_config(name="npz", path=str(path), **config), seed)


# --- npz loader ------------------------------------------------------------------------------------------------


def test_npz_with_x_and_y(tmp_path: Path) -> None:
    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 4])
    ds = load_npz(write_npz(tmp_path / "d.npz", x=x, y=y), validation_split=0.0)
    assert ds.name == "npz"
    assert ds.train.x.dtype == np.float32 and ds.train.y.dtype == np.int32
    np.testing.assert_array_equal(ds.train.x, x.astype(np.float32))
    np.testing.assert_array_equal(ds.train.y, y)
    assert ds.val is None and ds.val_size == 0
    assert ds.train_size == 10 and ds.sample_shape == (2,)
    assert ds.classes == 5  # max label 4, plus one


def test_npz_with_train_and_test_uses_the_test_split(tmp_path: Path) -> None:
    x_train, y_train = np.ones((5, 3)), np.array([0, 1, 0, 1, 0])
    x_test, y_test = np.full((2, 3), 2.0), np.array([1, 6])
    path = write_npz(tmp_path / "d.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    ds = load_npz(path, validation_split="test")
    assert (ds.train_size, ds.val_size) == (5, 2)
    np.testing.assert_array_equal(ds.train.x, x_train)
    np.testing.assert_array_equal(ds.train.y, y_train)
    np.testing.assert_array_equal(ds.val.x, x_test)
    np.testing.assert_array_equal(ds.val.y, y_test)
    assert ds.val.y.dtype == np.int32
    assert ds.classes == 7  # the test labels count too


def test_npz_with_train_only_rejects_test_split(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x_train=np.ones((4, 2)), y_train=np.array([0, 1, 0, 1]))
    with pytest.raises(ConfigError, match="dataset 'npz' has no test split"):
        load_npz(path, validation_split="test")


def test_npz_rank3_images_get_a_channel_axis(tmp_path: Path) -> None:
    x = np.arange(4 * 5 * 6, dtype=np.uint8).reshape(4, 5, 6)
    ds = load_npz(write_npz(tmp_path / "d.npz", x=x, y=np.array([0, 1, 2, 3])), validation_split=0.0)
    assert ds.train.x.shape == (4, 5, 6, 1)
    assert ds.sample_shape == (5, 6, 1)
    np.testing.assert_array_equal(ds.train.x[..., 0], x.astype(np.float32))


def test_npz_integral_float_labels_are_accepted(tmp_path: Path) -> None:
    y = np.array([0.0, 2.0, 1.0, 2.0], dtype=np.float32)
    ds = load_npz(write_npz(tmp_path / "d.npz", x=np.ones((4, 2)), y=y), validation_split=0.0)
    assert ds.train.y.dtype == np.int32
    np.testing.assert_array_equal(ds.train.y, [0, 2, 1, 2])
    assert ds.classes == 3


def test_npz_column_labels_are_flattened(tmp_path: Path) -> None:
    y = np.array([[1], [0], [3]])
    ds = load_npz(write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=y), validation_split=0.0)
    assert ds.train.y.shape == (3,)
    np.testing.assert_array_equal(ds.train.y, [1, 0, 3])


def test_single_class_still_counts_two_classes(tmp_path: Path) -> None:
    ds = load_npz(write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=np.zeros(3, int)), validation_split=0.0)
    assert ds.classes == 2


# --- npz errors ------------------------------------------------------------------------------------------------


def test_npz_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.npz"
    with pytest.raises(DataError, match=r"data\.path: npz file not found") as info:
        load_npz(missing)
    assert str(missing) in info.value.message


def test_npz_wrong_keys(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", images=np.ones((3, 2)), labels=np.zeros(3))
    with pytest.raises(DataError, match=r"needs arrays 'x' and 'y'.*it has \['images', 'labels'\]"):
        load_npz(path)


def test_npz_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    path.write_bytes(b"this is not numpy data at all")
    with pytest.raises(DataError, match=r"cannot read as \.npz"):
        load_npz(path)


def test_npz_length_mismatch(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones((5, 2)), y=np.array([0, 1, 0]))
    with pytest.raises(DataError, match=r"data\.y_train: has 3 labels for 5 samples"):
        load_npz(path)


def test_npz_negative_labels(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=np.array([0, -2, 1]))
    with pytest.raises(DataError, match=r"data\.y_train: labels must be >= 0 \(got -2\)"):
        load_npz(path)


def test_npz_non_integer_labels(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=np.array([0.0, 1.5, 1.0]))
    with pytest.raises(DataError, match=r"data\.y_train: labels must be integer class indices \(got 1\.5\)"):
        load_npz(path, task="classification")


def test_npz_nan_labels(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=np.array([0.0, np.nan, 1.0]))
    with pytest.raises(DataError, match=r"labels must be integer class indices \(got nan\)"):
        load_npz(path, task="classification")


def test_npz_empty_arrays(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.zeros((0, 4)), y=np.zeros(0, dtype=np.int64))
    with pytest.raises(DataError, match=r"data\.x_train: is empty"):
        load_npz(path, validation_split=0.0)


def test_npz_nan_in_samples(tmp_path: Path) -> None:
    x = np.ones((3, 2))
    x[1, 1] = np.nan
    path = write_npz(tmp_path / "d.npz", x=x, y=np.array([0, 1, 0]))
    with pytest.raises(DataError, match=r"data\.x_train: samples contain NaN or Inf"):
        load_npz(path, validation_split=0.0)


def test_npz_one_dimensional_samples(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones(3), y=np.array([0, 1, 0]))
    with pytest.raises(DataError, match=r"data\.x_train: needs one row per sample"):
        load_npz(path)


def test_npz_matrix_labels(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=np.eye(3))
    with pytest.raises(DataError, match=r"data\.y_train: class labels must be one integer class index per sample"):
        load_npz(path, task="classification")


def test_npz_non_numeric_samples(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.array([["a", "b"], ["c", "d"]]), y=np.array([0, 1]))
    with pytest.raises(DataError, match=r"data\.x_train: samples must be numeric"):
        load_npz(path)


def test_npz_bad_test_split_is_named(tmp_path: Path) -> None:
    path = write_npz(
        tmp_path / "d.npz",
        x_train=np.ones((4, 2)),
        y_train=np.array([0, 1, 0, 1]),
        x_test=np.ones((2, 2)),
        y_test=np.array([0, -1]),
    )
    with pytest.raises(DataError, match=r"data\.y_test: labels must be >= 0"):
        load_npz(path, validation_split="test")


def test_npz_test_split_with_other_sample_shape(tmp_path: Path) -> None:
    path = write_npz(
        tmp_path / "d.npz",
        x_train=np.ones((4, 2)),
        y_train=np.array([0, 1, 0, 1]),
        x_test=np.ones((2, 3)),
        y_test=np.array([0, 1]),
    )
    with pytest.raises(DataError, match=r"test samples have shape \(3,\), training samples \(2,\)"):
        load_npz(path, validation_split="test")


# --- IDX (mnist / fashion_mnist) -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
@pytest.mark.parametrize("compressed", [True, False])
def test_idx_folder_loads(tmp_path: Path, name: str, compressed: bool) -> None:
    folder = tmp_path / "idx"
    arrays = write_idx_folder(folder, compressed=compressed)
    present = sorted(p.name for p in folder.iterdir())
    assert all(p.endswith(".gz") == compressed for p in present)
    ds = dataset.load_dataset(data_config(name=name, path=str(folder), validation_split="test"), seed=0)
    assert ds.name == name
    assert ds.train.x.shape == (6, 3, 2, 1) and ds.val.x.shape == (4, 3, 2, 1)
    # The bytes stay bytes on the host; rescale: auto scales them by 1/255 on the device.
    assert ds.train.x.dtype == np.uint8 and ds.train.y.dtype == np.int32
    assert ds.scale == 1 / 255
    np.testing.assert_array_equal(ds.train.x[..., 0], arrays["x_train"])
    np.testing.assert_array_equal(ds.val.x, np.full((4, 3, 2, 1), 255, dtype=np.uint8))
    np.testing.assert_array_equal(ds.train.y, [0, 1, 2, 9, 4, 5])
    np.testing.assert_array_equal(ds.val.y, [3, 3, 7, 1])
    assert ds.classes == 10


def test_idx_folder_with_fraction_split(tmp_path: Path) -> None:
    write_idx_folder(tmp_path)
    ds = dataset.load_dataset(data_config(name="mnist", path=str(tmp_path), validation_split=0.5), seed=2)
    assert (ds.train_size, ds.val_size) == (3, 3)  # the six training images, halved; the test split is unused


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_missing_file_names_it_the_download_command_and_the_source(tmp_path: Path, name: str) -> None:
    write_idx_folder(tmp_path)
    (tmp_path / arrays.IDX_FILES["y_test"]).unlink()
    with pytest.raises(DataError) as info:
        dataset.load_dataset(data_config(name=name, path=str(tmp_path), validation_split="test"), seed=0)
    message = info.value.message
    assert message.startswith("data.path: ")
    assert f"{tmp_path / 't10k-labels-idx1-ubyte.gz'} not found" in message
    assert registry.SOURCES[name].download.url in message
    assert f"accumrun download {name} --to {tmp_path}" in message


def test_idx_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz not found.*storage\.googleapis\.com"):
        dataset.load_dataset(data_config(name="mnist", path=str(tmp_path)), seed=0)


@pytest.mark.parametrize("name", ["a.gz", "a"], ids=["gzip", "plain"])
def test_read_idx_roundtrip(tmp_path: Path, name: str) -> None:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    result = arrays.read_idx(write_idx(tmp_path / name, array))
    assert result.dtype == np.uint8 and result.shape == (2, 3, 4)
    np.testing.assert_array_equal(result, array)


@pytest.mark.parametrize(
    "magic",
    [b"\x00\x00\x0d\x01", b"\x01\x00\x08\x01", b"\x00\x00\x08"],
    ids=["float-type", "nonzero-lead", "too-short"],
)
def test_read_idx_bad_magic(tmp_path: Path, magic: bytes) -> None:
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(magic + (b"\x00\x00\x00\x02\x05\x06" if len(magic) == 4 else b"")))
    with pytest.raises(DataError, match=r"is not an IDX file of unsigned bytes \(bad magic number\)") as info:
        arrays.read_idx(path)
    assert repr(magic.hex()) in info.value.message


def test_read_idx_truncated_data(tmp_path: Path) -> None:
    raw = idx_bytes(np.zeros((5, 4), dtype=np.uint8))
    path = tmp_path / "short.gz"
    path.write_bytes(gzip.compress(raw[:-3]))
    with pytest.raises(DataError, match=r"holds 17 data bytes; its header \(5, 4\) needs 20"):
        arrays.read_idx(path)


def test_read_idx_trailing_data(tmp_path: Path) -> None:
    path = tmp_path / "long"
    path.write_bytes(idx_bytes(np.zeros((2, 2), dtype=np.uint8)) + b"\x01")
    with pytest.raises(DataError, match=r"holds 5 data bytes; its header \(2, 2\) needs 4"):
        arrays.read_idx(path)


def test_read_idx_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "header.gz"
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">I", 5)))  # rank 3, one dim given
    with pytest.raises(DataError, match=r"is truncated inside its header"):
        arrays.read_idx(path)


def test_read_idx_not_gzip(tmp_path: Path) -> None:
    path = tmp_path / "plain.gz"
    path.write_bytes(idx_bytes(np.zeros((2, 2), dtype=np.uint8)))  # uncompressed bytes under a .gz name
    with pytest.raises(DataError, match=r"plain\.gz is not a readable gzip file"):
        arrays.read_idx(path)


def test_read_idx_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.arange(100, dtype=np.uint8)))[:-10])
    with pytest.raises(DataError, match=r"cut\.gz is not a readable gzip file"):
        arrays.read_idx(path)


def test_idx_corrupt_file_in_folder_is_reported(tmp_path: Path) -> None:
    write_idx_folder(tmp_path)
    (tmp_path / arrays.IDX_FILES["x_test"]).write_bytes(gzip.compress(b"\x00\x00\x08\x03\x00\x00\x00\x01"))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz is truncated inside its header"):
        dataset.load_dataset(data_config(name="mnist", path=str(tmp_path)), seed=0)


# --- digits ----------------------------------------------------------------------------------------------------


def test_digits_bundled_set() -> None:
    ds = dataset.load_dataset(data_config(name="digits", validation_split=0.0), seed=0)
    assert ds.train_size == 1797 and ds.val_size == 0
    assert ds.train.x.shape == (1797, 8, 8, 1) and ds.sample_shape == (8, 8, 1)
    assert ds.classes == 10
    # Counts of 0..16, kept as uint8; rescale: auto divides them by 16 on the device.
    assert ds.train.x.dtype == np.uint8 and int(ds.train.x.min()) == 0 and int(ds.train.x.max()) == 16
    assert ds.scale == 1 / 16
    assert set(np.unique(ds.train.y).tolist()) == set(range(10))


def test_digits_validation_split() -> None:
    ds = dataset.load_dataset(data_config(name="digits", validation_split=0.1), seed=0)
    assert (ds.train_size, ds.val_size) == (1617, 180)
    assert ds.val.x.shape == (180, 8, 8, 1)
    assert ds.classes == 10


def test_digits_has_no_test_split() -> None:
    with pytest.raises(ConfigError, match=r"data\.validation_split: dataset 'digits' has no test split"):
        dataset.load_dataset(data_config(name="digits", validation_split="test"), seed=0)


# --- validation split ------------------------------------------------------------------------------------------


def _split(tmp_path: Path, seed: int, samples: int = 40, **config: object) -> dataset.Dataset:
    x, y = unique_rows(samples)
    path = tmp_path / "rows.npz"
    if not path.exists():
        write_npz(path, x=x, y=y)
    return load_npz(path, seed=seed, **config)


def test_split_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = _split(tmp_path, seed=5, validation_split=0.25)
    b = _split(tmp_path, seed=5, validation_split=0.25)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.val.x, b.val.x)
    np.testing.assert_array_equal(a.val.y, b.val.y)


def test_split_differs_for_another_seed(tmp_path: Path) -> None:
    a = _split(tmp_path, seed=5, validation_split=0.25)
    b = _split(tmp_path, seed=6, validation_split=0.25)
    assert set(a.val.x[:, 0].tolist()) != set(b.val.x[:, 0].tolist())


@pytest.mark.parametrize("shuffle", [True, False])
def test_split_is_disjoint_and_complete(tmp_path: Path, shuffle: bool) -> None:
    x, y = unique_rows(40)
    ds = _split(tmp_path, seed=3, validation_split=0.25, shuffle=shuffle)
    assert (ds.train_size, ds.val_size) == (30, 10)
    joined_x = np.concatenate([ds.train.x, ds.val.x])
    joined_y = np.concatenate([ds.train.y, ds.val.y])
    index = joined_x[:, 0].astype(int)
    np.testing.assert_array_equal(np.sort(index), np.arange(40))  # a permutation: nothing lost or repeated
    np.testing.assert_array_equal(joined_x, x[index])  # rows stay whole
    np.testing.assert_array_equal(joined_y, y[index])  # labels travel with their rows
    assert not set(ds.train.x[:, 0].tolist()) & set(ds.val.x[:, 0].tolist())


def test_split_without_shuffle_holds_out_the_tail(tmp_path: Path) -> None:
    ds = _split(tmp_path, seed=3, validation_split=0.25, shuffle=False)
    np.testing.assert_array_equal(ds.train.x[:, 0], np.arange(30))
    np.testing.assert_array_equal(ds.val.x[:, 0], np.arange(30, 40))
    other = _split(tmp_path, seed=99, validation_split=0.25, shuffle=False)
    np.testing.assert_array_equal(other.val.x, ds.val.x)  # the seed is irrelevant without shuffling


def test_split_with_shuffle_is_not_the_tail(tmp_path: Path) -> None:
    ds = _split(tmp_path, seed=3, validation_split=0.25, shuffle=True)
    assert sorted(ds.val.x[:, 0].tolist()) != list(range(30, 40))


def test_split_count_rounds(tmp_path: Path) -> None:
    ds = _split(tmp_path, seed=0, samples=10, validation_split=0.15)  # round(1.5) == 2
    assert (ds.train_size, ds.val_size) == (8, 2)


def test_split_too_small_for_one_sample(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.validation_split: leaves no validation sample out of 10 \(got 0\.01\)"):
        _split(tmp_path, seed=0, samples=10, validation_split=0.01)


def test_split_that_leaves_no_training_sample(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no training samples are left after the validation split \(got 10\)"):
        _split(tmp_path, seed=0, samples=10, validation_split=0.99)


# --- synthetic -------------------------------------------------------------------------------------------------


def _synthetic(seed: int, **config: object) -> dataset.Dataset:
    settings: dict[str, object] = {"samples": 600, "shape": [6], "classes": 4, "validation_split": 0.0}
    settings.update(config)
    return dataset.load_dataset(data_config(name="synthetic", **settings), seed)


def test_synthetic_is_deterministic_for_a_seed() -> None:
    a, b, c = _synthetic(seed=7), _synthetic(seed=7), _synthetic(seed=8)
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.train.y, b.train.y)
    assert not np.allclose(a.train.x, c.train.x)


def test_synthetic_shape_and_classes() -> None:
    ds = _synthetic(seed=1, samples=50, shape=[5, 3, 2], classes=7, validation_split=0.2)
    assert (ds.train_size, ds.val_size) == (40, 10)
    assert ds.train.x.shape == (40, 5, 3, 2) and ds.sample_shape == (5, 3, 2)
    assert ds.train.x.dtype == np.float32 and ds.train.y.dtype == np.int32
    assert ds.classes == 7
    labels = np.concatenate([ds.train.y, ds.val.y])
    assert labels.min() >= 0 and labels.max() == 6


def test_synthetic_rank2_shape_gets_a_channel_axis() -> None:
    ds = _synthetic(seed=1, samples=10, shape=[4, 4])
    assert ds.sample_shape == (4, 4, 1)


def test_synthetic_is_learnable() -> None:
    ds = _synthetic(seed=0, samples=2000, shape=[16], classes=5, validation_split=0.25)
    means = np.stack([ds.train.x[ds.train.y == c].mean(axis=0) for c in range(ds.classes)])
    distances = ((ds.val.x[:, None, :] - means[None]) ** 2).sum(axis=-1)
    accuracy = float((distances.argmin(axis=1) == ds.val.y).mean())
    assert accuracy > 0.6  # chance is 0.2


# --- epoch order -----------------------------------------------------------------------------------------------


def test_epoch_order_is_a_function_of_seed_and_epoch() -> None:
    np.testing.assert_array_equal(dataset.epoch_order(50, 3, 2, True), dataset.epoch_order(50, 3, 2, True))
    assert not np.array_equal(dataset.epoch_order(50, 3, 2, True), dataset.epoch_order(50, 3, 3, True))
    assert not np.array_equal(dataset.epoch_order(50, 3, 2, True), dataset.epoch_order(50, 4, 2, True))


def test_epoch_order_is_a_permutation() -> None:
    order = dataset.epoch_order(37, 1, 0, True)
    assert order.shape == (37,)
    np.testing.assert_array_equal(np.sort(order), np.arange(37))
    assert not np.array_equal(order, np.arange(37))


def test_epoch_order_without_shuffle() -> None:
    for epoch in range(3):
        np.testing.assert_array_equal(dataset.epoch_order(12, 9, epoch, False), np.arange(12))


def test_read_idx_damaged_gzip_stream(tmp_path: Path) -> None:
    compressed = bytearray(gzip.compress(idx_bytes(np.arange(64, dtype=np.uint8).reshape(8, 8))))
    compressed[12] ^= 0xFF  # inside the deflate stream: zlib, not gzip's header check, notices
    path = tmp_path / "damaged-idx3-ubyte.gz"
    path.write_bytes(bytes(compressed))
    with pytest.raises(DataError, match="is not a readable gzip file"):
        arrays.read_idx(path)


def test_npy_file_given_as_npz(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 2)))
    with pytest.raises(DataError, match=r"data.path: is a single array, not an .npz archive"):
        load_npz(tmp_path / "x.npy")


def test_huge_labels_are_refused_not_wrapped(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.zeros((3, 2)), y=np.array([0, 1, 2**32], dtype=np.int64))
    with pytest.raises(
        DataError, match=r"data.y_train: labels must be class indices below 1,000,000 \(got 4294967296\)"
    ):
        load_npz(path, validation_split=0.0)


def test_boolean_labels_are_classes_0_and_1(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.zeros((4, 2)), y=np.array([True, False, True, True]))
    dataset = load_npz(path, validation_split=0.0)
    assert dataset.train.y.tolist() == [1, 0, 1, 1] and dataset.classes == 2


@pytest.mark.parametrize(
    ("y", "task"),
    [
        pytest.param(np.array([0, 2, 1, 2]), "classification", id="integers"),
        pytest.param(np.array([0.0, 2.0, 1.0, 2.0]), "classification", id="integral-floats"),
        pytest.param(np.array([[1], [0], [2], [1]]), "classification", id="a-column-of-integers"),
        pytest.param(np.array([[0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 1]]), "multi_label", id="rows-of-0-1"),
        pytest.param(np.array([[0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 1]], dtype=bool), "multi_label", id="bool-rows"),
        pytest.param(np.array([0.5, -1.25, 3.0, 0.0]), "regression", id="float-values"),
        pytest.param(np.array([[0.5, 1.0], [2.0, 0.0], [1.5, 1.0], [0.0, 0.0]]), "regression", id="float-rows"),
    ],
)
def test_task_auto_reads_the_targets(tmp_path: Path, y: np.ndarray, task: str) -> None:
    ds = load_npz(write_npz(tmp_path / "d.npz", x=np.ones((4, 2)), y=y), validation_split=0.0)
    assert ds.task is Task(task)
    expected = {"classification": (np.int32, ()), "multi_label": (np.float32, (3,)), "regression": (np.float32, None)}
    dtype, shape = expected[task]
    assert ds.train.y.dtype == dtype
    # A regression target of one value per sample is a column: the model's output then has the same shape.
    assert ds.target_shape == (shape if shape is not None else (y.shape[1] if y.ndim == 2 else 1,))


def test_multi_label_targets_must_be_0_or_1(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz", x=np.ones((3, 2)), y=np.array([[0, 1], [2, 0], [1, 1]]))
    with pytest.raises(DataError, match=r"data\.y_train: multi-label targets must be 0 or 1 \(got 2\.0\)"):
        load_npz(path, task="multi_label", validation_split=0.0)


@pytest.mark.parametrize("task", ["regression", "multi_label"])
def test_synthetic_data_makes_each_task(task: str) -> None:
    config = data_config(name="synthetic", samples=64, shape=[3], classes=4, task=task, validation_split=0.0)
    ds = dataset.load_dataset(config, seed=0)
    assert ds.task is Task(task)
    assert ds.target_shape == ((4,) if task == "multi_label" else (1,))
    assert ds.train.y.std() > 0.1  # learnable targets, not constants


@pytest.mark.parametrize(
    ("dtype", "scale"), [(np.uint8, 1 / 255), (np.uint16, 1 / 65535), (np.int16, 1.0), (np.float64, 1.0)]
)
def test_small_integers_keep_their_dtype_and_auto_scales_unsigned_ones_to_one(
    tmp_path: Path, dtype: type, scale: float
) -> None:
    x = np.arange(24).reshape(6, 4).astype(dtype)
    ds = load_npz(write_npz(tmp_path / "d.npz", x=x, y=np.arange(6) % 2), validation_split=0.0)
    assert ds.train.x.dtype == (np.float32 if dtype == np.float64 else dtype)
    assert ds.scale == scale


def test_every_source_the_config_accepts_has_a_loader_in_the_same_order() -> None:
    assert list(registry.SOURCES) == list(DATA_SECTIONS)


def test_evaluating_other_data_reads_that_path_alone() -> None:
    config = data_config(name="csv", path="a.csv", label="y", validation_path="b.csv", validation_split=0.0)
    other = config.reading("c.csv")
    assert isinstance(other, CsvConfig)
    assert (other.path, other.validation_path, other.validation_split, other.label) == ("c.csv", None, 0.0, "y")
    assert data_config(name="npz", path="a.npz").reading("c.npz").path == "c.npz"
