"""The data sources, registered once: for each ``data.name``, its config section, its loader and its download.

The config's ``data`` union and key table, :func:`accumrun.data.dataset.load_dataset` and ``accumrun download`` read
this table, in the order the docs list the sources. Loaders return splits as the files hold them, which
:mod:`accumrun.data.dataset` checks. No module here imports TensorFlow, so loading a config stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from accumrun.data.arrays import (
    DOWNLOADS,
    DigitsConfig,
    Download,
    IdxConfig,
    NpzConfig,
    SyntheticConfig,
    load_digits,
    load_idx_folder,
    load_npz,
    load_synthetic,
)
from accumrun.data.images import ImageFolderConfig, load_image_folder
from accumrun.data.records import TfrecordConfig, load_tfrecord
from accumrun.data.section import DataSection
from accumrun.data.splits import Splits
from accumrun.data.tables import CsvConfig, JsonlConfig, load_csv, load_jsonl
from accumrun.data.text import TextCorpusConfig, TextFolderConfig, load_text_corpus, load_text_folder
from accumrun.data.tfds_source import TfdsConfig, load_tfds
from accumrun.data.tokens import TokensConfig, load_tokens

SectionT = TypeVar("SectionT", bound=DataSection)


@dataclass(frozen=True)
class Registered(Generic[SectionT]):
    """One ``data.name``: its section, its loader (which takes that section and the seed), and its download."""

    section: type[SectionT]
    load: Callable[[SectionT, int], Splits]
    download: Download | None = None


SOURCES: dict[str, Registered[Any]] = {
    "digits": Registered(DigitsConfig, load_digits),
    "npz": Registered(NpzConfig, load_npz),
    "mnist": Registered(IdxConfig, load_idx_folder, DOWNLOADS["mnist"]),
    "fashion_mnist": Registered(IdxConfig, load_idx_folder, DOWNLOADS["fashion_mnist"]),
    "synthetic": Registered(SyntheticConfig, load_synthetic),
    "image_folder": Registered(ImageFolderConfig, load_image_folder),
    "tfrecord": Registered(TfrecordConfig, load_tfrecord),
    "csv": Registered(CsvConfig, load_csv),
    "tfds": Registered(TfdsConfig, load_tfds),
    "text_folder": Registered(TextFolderConfig, load_text_folder),
    "text_corpus": Registered(TextCorpusConfig, load_text_corpus),
    "jsonl": Registered(JsonlConfig, load_jsonl),
    "tokens": Registered(TokensConfig, load_tokens),
}
"""Every dataset name the config accepts, in the order the docs list them."""

DATA_SECTIONS: dict[str, type[DataSection]] = {name: source.section for name, source in SOURCES.items()}
"""Every ``data.name`` and its section: the config's ``data`` union is built from it."""

DOWNLOADABLE = [name for name, source in SOURCES.items() if source.download is not None]
