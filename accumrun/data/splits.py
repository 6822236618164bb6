"""What a split of data is before it is read: arrays in memory, a list of image files or of text files, the
records of a text table (their byte spans in its file), TFRecord files, the decoded images kept by ``data.cache``,
or the windows of a corpus's token file (``text_corpus`` with ``data.cache: disk``); and the order in which an epoch
visits a split's samples.

Each kind knows its size, one sample's stored shape and dtype, one sample's target shape, and how to keep a
subset of its samples (the validation hold-out). Reading them, through ``tf.data``, is
:mod:`accumrun.data.readers`' job; this module imports no TensorFlow.

Every kind may carry one weight per sample, ``w`` (``data.weight``, or ``training.class_weight`` for the training
split), aligned with ``y``; readers hand the two to the step together (see :mod:`accumrun.core.targets`).

Samples keep the dtype their source stores: uint8 images stay one byte per value on the host and cross to the
device as such; the model's input layers cast and rescale them, one sub-batch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from accumrun.data.tokenizers import Tokenizer
from accumrun.errors import DataError
from accumrun.kinds import Task

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""The files an image folder reads, as ``keras.utils.image_dataset_from_directory`` does."""


@dataclass(frozen=True)
class ArraySplit:
    """Samples and targets held in memory, in the samples' stored dtype, and optionally a weight per sample."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.y)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.x.dtype

    @property
    def target_shape(self) -> tuple[int, ...]:
        return tuple(self.y.shape[1:])

    def subset(self, index: np.ndarray) -> ArraySplit:
        return ArraySplit(self.x[index], self.y[index], _rows(self.w, index))


class _EncodedImages:
    """What image sources share: samples are decoded to uint8 images of ``image_size`` and ``channels``, one per
    label in ``y``."""

    y: np.ndarray
    image_size: tuple[int, int]
    channels: int

    @property
    def size(self) -> int:
        return len(self.y)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (*self.image_size, self.channels)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def target_shape(self) -> tuple[int, ...]:
        return tuple(self.y.shape[1:])


@dataclass(frozen=True)
class ImageFiles(_EncodedImages):
    """Image files and their class indices; each is decoded and resized to ``image_size`` when it is read."""

    paths: np.ndarray
    """The files, as an array of path strings (so that a subset is one indexing)."""
    y: np.ndarray
    image_size: tuple[int, int]
    channels: int
    w: np.ndarray | None = None

    def subset(self, index: np.ndarray) -> ImageFiles:
        return replace(self, paths=self.paths[index], y=self.y[index], w=_rows(self.w, index))


class _LabelledTokens:
    """What text sources with a label per sample share: each sample is ``length`` int32 token ids, one per label in
    ``y``, tokenized when it is read."""

    y: np.ndarray
    length: int

    @property
    def size(self) -> int:
        return len(self.y)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    @property
    def target_shape(self) -> tuple[int, ...]:
        return tuple(self.y.shape[1:])


@dataclass(frozen=True)
class TextFiles(_LabelledTokens):
    """UTF-8 text files and their class indices; each is read and tokenized to ``length`` int32 token ids (cut, or
    padded with 0) when it is read, so that no more text than the stream holds is ever in memory."""

    paths: np.ndarray
    """The files, as an array of path strings (so that a subset is one indexing)."""
    y: np.ndarray
    tokenizer: Tokenizer
    length: int
    w: np.ndarray | None = None

    def subset(self, index: np.ndarray) -> TextFiles:
        return replace(self, paths=self.paths[index], y=self.y[index], w=_rows(self.w, index))


@dataclass(frozen=True)
class TextRows(_LabelledTokens):
    """The records of one text table (a JSON Lines file, a CSV with ``data.text``), by their byte spans in the
    file, and their labels: each record's text is read back from the file and tokenized to ``length`` int32 token
    ids when it is read (``data.cache: none``; see :mod:`accumrun.data.rows`), so no text is held in memory."""

    path: str
    spans: np.ndarray
    """One row ``[start, end)`` per record: its bytes in the file, int64."""
    y: np.ndarray
    tokenizer: Tokenizer
    length: int
    text: str | int
    """Where a record's text is: a JSON object's key (a str), or a CSV record's column index (an int)."""
    w: np.ndarray | None = None

    def subset(self, index: np.ndarray) -> TextRows:
        return replace(self, spans=self.spans[index], y=self.y[index], w=_rows(self.w, index))


@dataclass(frozen=True)
class RecordFiles(_EncodedImages):
    """TFRecord files of ``tf.train.Example``: an encoded image and an int64 class label each.

    Records are numbered across the files in their sorted order; ``records`` is the numbers this split holds
    (all of them, or one side of the validation hold-out), and ``y`` their labels, read once at startup.
    """

    files: tuple[str, ...]
    counts: tuple[int, ...]
    """Records per file."""
    records: np.ndarray
    y: np.ndarray
    image_key: str
    label_key: str
    image_size: tuple[int, int]
    channels: int
    shuffle_buffer: int
    w: np.ndarray | None = None
    """The records' weights (``data.weight``, read at startup with the labels, or class weights), or None."""

    @property
    def complete(self) -> bool:
        """Whether the split holds every record of its files (no hold-out to filter out)."""
        return self.size == sum(self.counts)

    def subset(self, index: np.ndarray) -> RecordFiles:
        chosen = np.sort(index)
        return replace(self, records=self.records[chosen], y=self.y[chosen], w=_rows(self.w, chosen))


@dataclass(frozen=True)
class CachedImages:
    """The decoded images of an image split, kept by ``data.cache``: one uint8 row per sample, in a folder of raw
    files (``disk``) or in ``pixels`` (``memory``).

    ``source`` still decides the order, the labels and each sample's index (the draw of its augmentation), so
    training sees exactly what decoding the files gives. Rows are matched to samples by identity (a file's path,
    a record's number), so a subset of the split still finds its rows.
    """

    source: ImageFiles | RecordFiles
    keys: np.ndarray
    """The cached samples' identities, sorted: row ``r`` holds ``keys[r]`` (see :func:`identities`)."""
    folder: str | None = None
    """``disk``: the cache folder; row ``r`` is the file :func:`cached_file` names."""
    pixels: np.ndarray | None = None
    """``memory``: the rows."""

    @property
    def y(self) -> np.ndarray:
        return self.source.y

    @property
    def w(self) -> np.ndarray | None:
        return self.source.w

    @property
    def size(self) -> int:
        return self.source.size

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.source.sample_shape

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    @property
    def target_shape(self) -> tuple[int, ...]:
        return self.source.target_shape

    @property
    def rows(self) -> np.ndarray:
        """Each sample's row in the cache."""
        return np.searchsorted(self.keys, identities(self.source))

    def subset(self, index: np.ndarray) -> CachedImages:
        return replace(self, source=self.source.subset(index))


@dataclass(frozen=True)
class CorpusWindows:
    """The windows of a corpus whose token ids lie in one file (``text_corpus`` with ``data.cache: disk``, see
    :mod:`accumrun.data.corpus`): int32 ids of every text, concatenated. A window is ``length`` tokens from
    ``begins`` (an absolute token offset) and the targets one token on, cut at ``ends`` (its text's end) and
    padded with 0; so windows never cross texts, and none is read before the epoch's order reaches it."""

    file: str
    """The token file: little-endian int32 ids."""
    begins: np.ndarray
    ends: np.ndarray
    length: int
    w: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.begins)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    @property
    def target_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def lengths(self) -> np.ndarray:
        """Each window's real input tokens (its ids that are not padding), known without reading the file."""
        return np.minimum(self.ends - self.begins - 1, self.length)

    def subset(self, index: np.ndarray) -> CorpusWindows:
        return replace(self, begins=self.begins[index], ends=self.ends[index], w=_rows(self.w, index))


def identities(split: ImageFiles | RecordFiles) -> np.ndarray:
    """What names each sample of an image split for the cache: its file's path, or its record's number."""
    return split.paths if isinstance(split, ImageFiles) else split.records


def cached_file(folder: str, row: int) -> str:
    """The file that holds row ``row`` of a disk cache: the image's raw bytes, row by row, channels last."""
    return f"{folder}/{row:08d}.u8"


Split = ArraySplit | ImageFiles | TextFiles | TextRows | RecordFiles | CachedImages | CorpusWindows
"""One split of a dataset, as a source gives it (or ``data.cache`` keeps it)."""


def _rows(w: np.ndarray | None, index: np.ndarray) -> np.ndarray | None:
    return None if w is None else w[index]


def targets_held(split: Split) -> np.ndarray:
    """The targets of a split that holds them (class labels, values): every kind but a corpus's windows on disk,
    whose targets are its token ids, read with its samples.

    Raises:
        ValueError: ``split`` is a corpus's windows on disk.
    """
    if isinstance(split, CorpusWindows):
        raise ValueError("a corpus's windows on disk read their targets with their samples")
    return split.y


def with_weights(split: Split, w: np.ndarray) -> Split:
    """``split`` with ``w`` as its samples' weights (one per sample, in its order)."""
    if isinstance(split, CachedImages):
        return replace(split, source=replace(split.source, w=w))
    return replace(split, w=w)


def seeded_hold_out(shuffle: bool, files: bool) -> bool:
    """Whether the validation hold-out is drawn by the seed: with ``data.shuffle``, and always for a split of files
    (they are listed class by class, so their tail would be the last class)."""
    return shuffle or files


def hold_out(size: int, fraction: float, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the samples that ``validation_split: fraction`` keeps for training and of those it holds out
    for validation: a seeded permutation's tail (without ``shuffle``, the samples' own tail, as Keras'
    ``validation_split`` takes). The one rule for the hold-out, which a learned vocabulary reads too, so it learns
    from exactly the training samples.

    Raises:
        DataError: the fraction holds out no sample.
    """
    count = round(size * fraction)
    if count == 0:
        raise DataError("data.validation_split", f"leaves no validation sample out of {size}", fraction)
    order = np.random.default_rng(seed).permutation(size) if shuffle else np.arange(size)
    return order[: size - count], order[size - count :]


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which training samples are visited in ``epoch`` (0-based): a function of these alone."""
    if not shuffle:
        return np.arange(size)
    return np.random.default_rng([seed, epoch]).permutation(size)


@dataclass(frozen=True)
class Splits:
    """What a loader returns: the training split and, when the source has one, a test or validation split."""

    train: Split
    test: Split | None = None
    class_names: list[str] | None = None
    """The classes' names in label order, where the source names them (an image folder's subfolders)."""
    skipped: int = 0
    """Files passed over because they are not images."""
    scale: float | None = None
    """What ``rescale: auto`` multiplies the raw samples by, where the source knows (digits' counts of 0..16);
    None leaves it to the dtype: 1/255 for uint8, nothing for floats."""
    features: list[str] | None = None
    """A table's feature columns, in the order the model takes them."""
    vocabulary_size: int | None = None
    """For token ids (a text source): how many ids the tokenizer has, padding's 0 among them."""
    task: Task | None = None
    """The one task the source poses, where it poses only one (a text corpus: ``causal_lm``); None: read from the
    targets."""
