"""``data.name: tfds``: a TensorFlow Datasets dataset already prepared in ``data.data_dir`` (``tensorflow-datasets``
is optional). accumrun never downloads or prepares one: prepare it where the network is (``tfds build NAME
--data_dir DIR``). A prepared image dataset is TFRecord files of ``tf.train.Example`` (an encoded ``image``, an int64
``label``), so it streams exactly as ``data.name: tfrecord`` does; the class names come from its metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from accumrun.data.records import RecordLayout, first_line, read_record_files
from accumrun.data.section import ImageSourceConfig
from accumrun.data.splits import Splits
from accumrun.errors import ConfigError, DataError


class TfdsConfig(ImageSourceConfig):
    """``name: tfds``: a TensorFlow Datasets image-classification dataset already prepared in ``data_dir``."""

    reads_path = False
    needs = {**ImageSourceConfig.needs, "dataset": "the name of a prepared dataset"}
    name: Literal["tfds"]
    dataset: str = Field(min_length=1)
    """The name of a dataset prepared in ``data_dir`` (accumrun never downloads it)."""
    data_dir: str | None = None
    shuffle_buffer: int = Field(10_000, ge=1)
    """The seeded shuffle buffer after the per-epoch permutation of the files."""


def load_tfds(config: TfdsConfig, seed: int) -> Splits:
    """The prepared ``train`` split of ``data.dataset`` (and ``test``, for ``validation_split: test``).

    Raises:
        ConfigError: ``tensorflow-datasets`` is not installed, or ``data.dataset`` is unknown.
        DataError: the dataset is not prepared in ``data.data_dir``, or is not image classification.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ConfigError(
            "data.name", "tfds needs the optional package: pip install tensorflow-datasets", "tfds"
        ) from None
    try:
        builder = tfds.builder(config.dataset, data_dir=config.data_dir)
    except Exception as error:  # tfds raises its own DatasetNotFoundError and friends
        raise ConfigError("data.dataset", f"{type(error).__name__}: {first_line(error)}", config.dataset) from None
    if not Path(builder.data_dir).is_dir() or "train" not in builder.info.splits:
        where = config.data_dir or "the default TFDS folder"
        raise DataError(
            "data.data_dir",
            f"{config.dataset} is not prepared in {where}; prepare it where the network is (tfds build "
            f"{config.dataset} --data_dir DIR) and copy DIR here; accumrun never downloads",
        )
    features: Any = builder.info.features
    if "image" not in features or "label" not in features:
        raise DataError("data.dataset", f"needs 'image' and 'label' features; it has {sorted(features)}")
    layout = RecordLayout("image", "label", config.size, config.channels, config.shuffle_buffer)
    splits = {name: builder.info.splits[name].filenames for name in ("train", "test") if name in builder.info.splits}
    files = {name: [str(Path(builder.data_dir) / file) for file in names] for name, names in splits.items()}
    train = read_record_files(files["train"], "data.dataset", layout)
    test = read_record_files(files["test"], "data.dataset", layout) if "test" in files else None
    names = list(getattr(features["label"], "names", []) or [])
    return Splits(train, test, class_names=names or None)
