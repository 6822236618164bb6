"""The config schema: one pydantic model per YAML section, with the per-key rules, and the rules that span keys.

``data`` and ``model`` are unions chosen by ``name``: each data source and each kind of model has its own
section, so a key that the chosen one does not read is refused here. The closed sets (task, BatchNorm mode,
feed, ...) parse into the enums of :mod:`accumrun.kinds`, with ``auto`` beside them where a key allows it, and
are written back as their words. Loading, overrides and error messages are in :mod:`accumrun.config.loading`.
This module imports nothing of accumrun but ``errors`` and ``kinds``, and neither TensorFlow nor Keras, so
``check`` and ``--help`` stay fast.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from accumrun.errors import describe
from accumrun.kinds import (
    BatchNormMode,
    CacheMode,
    Cluster,
    ColorMode,
    Direction,
    Feed,
    Kind,
    OnNonFinite,
    Precision,
    RandomDraws,
    Strategy,
    Task,
)


class _Section(BaseModel):
    """A config section: strict types (YAML already typed the values) and no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NormalizeConfig(_Section):
    """``(x - mean) / std`` per channel, after ``rescale``: one value per channel, or one for all."""

    mean: list[float] = Field(min_length=1)
    std: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)


class AugmentConfig(BaseModel):
    """A Keras image preprocessing layer by name (``random_flip``, ``random_crop``, ...); other keys are its
    keywords (``mode: horizontal``, ``height: 56``)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str

    @property
    def keywords(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _listed(words: list[str]) -> str:
    """``'a', 'b' or 'c'``: the allowed words, as an error message lists them."""
    *others, last = (repr(word) for word in words)
    return f"{', '.join(others)} or {last}" if others else last


def _words(kind: type[Kind], *, auto: bool = False) -> BeforeValidator:
    """Parse a member of ``kind`` from its word (and ``auto`` where the key allows it), naming every allowed word
    when the value is none of them."""
    allowed = ["auto", *kind.words()] if auto else kind.words()

    def parse(value: Any) -> Any:
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"input should be {_listed(allowed)}")
        return value if value == "auto" else kind(value)

    return BeforeValidator(parse)


class DataSection(_Section):
    """The ``data`` keys that every source reads; each source's section adds its own (see :data:`DATA_SECTIONS`)."""

    reads_path: ClassVar[bool] = True
    """Whether ``data.path`` means anything to this source; where it does not, a path is refused."""
    labelled_files: ClassVar[bool] = False
    """Whether the source lists files under their class labels (its hold-out is always seeded)."""
    images: ClassVar[bool] = False
    """Whether the source's samples are encoded images (predict then reads image files)."""
    needs: ClassVar[dict[str, str]] = {}
    """What each required key of this source holds, for the message when it is missing."""

    name: str
    path: str | None = None
    """The npz file, IDX folder, image folder, TFRecord glob or CSV file the source reads."""
    validation_split: float | Literal["test"] = 0.1
    shuffle: bool = True
    task: Annotated[Literal["auto"] | Task, _words(Task, auto=True)] = "auto"
    """What the targets are; ``auto`` reads them (see :func:`accumrun.data.dataset.infer_task`), and makes two
    classes binary when the model has one output unit."""
    rescale: float | Literal["auto"] | bool = "auto"
    """A factor the raw samples are multiplied by on the device: ``auto`` is 1/255 for uint8 images (1/16 for the
    bundled digits' counts, none for floats), ``false`` none."""
    normalize: NormalizeConfig | None = None
    augment: list[AugmentConfig] = Field(default_factory=list)
    """Training only: Keras image preprocessing layers by name, drawn per (seed, epoch, sample)."""
    feed: Annotated[Literal["auto"] | Feed, _words(Feed, auto=True)] = "auto"
    """How batches reach the step: whole (``batch``), or streamed one sub-batch at a time (``sub_batch``), when
    the batch itself does not fit; ``auto`` follows the memory estimate."""

    @field_validator("path")
    @classmethod
    def _read_by_the_source(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not cls.reads_path:
            raise ValueError(f"is not used by data.name: {info.data.get('name')}")
        return value

    @field_validator("rescale", mode="before")
    @classmethod
    def _factor(cls, value: Any) -> Any:
        if value is False or value == "auto":  # not `in`: 0 == False would let a factor of 0 through
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError("must be 'auto', false, or a positive factor such as 0.00392156862745098 (1/255)")
        return float(value)

    @field_validator("validation_split", mode="before")
    @classmethod
    def _fraction_or_test(cls, value: Any) -> Any:
        if value == "test":
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ValueError("must be a fraction in [0, 1) or 'test' (the dataset's test split)")
        return float(value)

    def reading(self, path: str) -> DataSection:
        """The same source reading ``path`` instead, all of it (no validation split): what ``evaluate --data``
        scores."""
        return self.model_copy(update={"path": path, "validation_split": 0.0})

    @property
    def cache_wrapper(self) -> tuple[CacheMode, str]:
        """``data.cache`` where a cache wraps the source's splits (:mod:`accumrun.data.cache`): its mode and
        ``cache_dir``; ``none`` where the source takes no cache or its loader reads it (a table, a corpus)."""
        return CacheMode.NONE, ""

    @property
    def validation_file(self) -> str | None:
        """``data.validation_path``, where the source reads one."""
        return None

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        """The tokenizer and sequence length of a source whose samples are text; None for any other."""
        return None

    @property
    def token_bucket(self) -> int | None:
        """``bucket`` of a source of token ids (bucketed padding), else None."""
        return None

    @property
    def id_column(self) -> str | None:
        """The column that names each row (a CSV's ``id``), else None."""
        return None

    @property
    def named_columns(self) -> tuple[str | None, ...]:
        """The columns that hold something else than a feature (a CSV's labels and id)."""
        return ()


class DigitsConfig(DataSection):
    """``name: digits``: the bundled 8x8 digits."""

    reads_path = False
    name: Literal["digits"] = "digits"


class SampleWeights(_Section):
    """``data.weight``, for the sources whose samples can carry a weight each."""

    weight: str | None = Field(None, min_length=1)
    """Where each sample's weight is: an npz array (``w``, or ``w_train`` and ``w_test`` beside ``x_train``), a
    CSV column (then no feature), a TFRecord float feature. Each sample's loss is multiplied by it."""


class NpzConfig(SampleWeights, DataSection):
    """``name: npz``: arrays ``x`` and ``y`` (or ``x_train``, ``y_train`` and optionally a test pair) in a file."""

    needs = {"path": "the path of an .npz file"}
    name: Literal["npz"]
    path: str = Field(min_length=1)


class IdxConfig(DataSection):
    """``name: mnist`` or ``fashion_mnist``: the four IDX files, from ``path`` or ``datasets/NAME``."""

    name: Literal["mnist", "fashion_mnist"]


class SyntheticConfig(DataSection):
    """``name: synthetic``: learnable data of any task, made from the seed."""

    reads_path = False
    name: Literal["synthetic"]
    samples: int = Field(2048, ge=1)
    shape: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [28, 28, 1], min_length=1)
    classes: int = Field(10, ge=2)


class FileSourceConfig(DataSection):
    """A source that reads files the user names: ``path``, and ``validation_path`` to validate on instead of
    ``validation_split``."""

    path: str = Field(min_length=1)
    validation_path: str | None = None
    """A second folder or file of the same kind to validate on, instead of ``validation_split``."""

    def reading(self, path: str) -> DataSection:
        return self.model_copy(update={"path": path, "validation_path": None, "validation_split": 0.0})

    @property
    def validation_file(self) -> str | None:
        return self.validation_path


class ImageSourceConfig(DataSection):
    """A source of encoded images, decoded and resized to ``image_size`` as they stream."""

    images = True

    needs = {"image_size": "[height, width] to resize images to"}
    image_size: list[int]
    """``[height, width]`` to resize every image to after decoding."""
    color_mode: Annotated[ColorMode, _words(ColorMode)] = ColorMode.RGB
    cache: Annotated[CacheMode, _words(CacheMode)] = CacheMode.NONE
    """Keep the decoded, resized images: ``memory`` decodes each split once at load, ``disk`` writes them under
    ``cache_dir`` for this run and the next ones over the same files (see :mod:`accumrun.data.cache`)."""
    cache_dir: str = Field("~/.cache/accumrun/", min_length=1)
    """Where ``cache: disk`` writes (``~`` is expanded): one folder per split, named by its files and the decode
    settings."""

    @field_validator("image_size", mode="before")
    @classmethod
    def _two_positive_integers(cls, value: Any) -> Any:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        ):
            raise ValueError("must be two positive integers [height, width]")
        return value

    @property
    def size(self) -> tuple[int, int]:
        """``image_size`` as ``(height, width)``."""
        height, width = self.image_size
        return height, width

    @property
    def channels(self) -> int:
        """Channels of a decoded image: 3 for ``rgb``, 1 for ``grayscale``."""
        return 3 if self.color_mode == ColorMode.RGB else 1

    @property
    def cache_wrapper(self) -> tuple[CacheMode, str]:
        return self.cache, self.cache_dir


class ImageFolderConfig(FileSourceConfig, ImageSourceConfig):
    """``name: image_folder``: one subfolder of images per class."""

    needs = {**ImageSourceConfig.needs, "path": "a folder with one subfolder of images per class"}
    name: Literal["image_folder"]


class TfrecordConfig(SampleWeights, FileSourceConfig, ImageSourceConfig):
    """``name: tfrecord``: ``tf.train.Example`` records of an encoded image and an int64 label."""

    needs = {**ImageSourceConfig.needs, "path": "a TFRecord file or a glob of them"}
    name: Literal["tfrecord"]
    image_key: str = "image/encoded"
    label_key: str = "image/class/label"
    shuffle_buffer: int = Field(10_000, ge=1)
    """The seeded shuffle buffer after the per-epoch permutation of the files."""


class _Tokenizer(_Section):
    """What every ``data.tokenizer`` section tells a cache of its ids (:mod:`accumrun.data.corpus`)."""

    keras_hub: ClassVar[bool] = False
    """Whether the ids are KerasHub's (its version then decides them too)."""

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        """What decides the ids this tokenizer gives: its settings, and the content of the files it reads (hashed
        by ``file_hash``)."""
        raise NotImplementedError


class ByteTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: byte}``: each UTF-8 byte is a token (ids 1 to 256; 0 pads), no vocabulary to learn."""

    name: Literal["byte"]

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        return {"name": self.name}


class CharacterTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: character}``: each Unicode code point ``c`` is a token, id ``c + 2`` when that is below
    ``vocabulary_size``, else 1 (unknown); 0 pads. No vocabulary to learn: the default 258 ids cover Latin-1
    (U+0000 to U+00FF); 65,538 would cover the Basic Multilingual Plane."""

    name: Literal["character"]
    vocabulary_size: int = Field(258, ge=3)
    """Ids in all, padding's 0 and unknown's 1 among them."""

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        return {"name": self.name, "vocabulary_size": self.vocabulary_size}


MIN_LEARNED_VOCABULARY = 100
"""The least ``vocabulary_size`` a learned WordPiece vocabulary may have: the learner keeps the single characters
first (with and without ``##``), and below about this many ids it cuts them, and text becomes unknown tokens."""


class WordPieceTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: word_piece, vocabulary: FILE}``: KerasHub's WordPiece over a vocabulary file, one token
    per line, its first line the padding token (id 0, as ``[PAD]`` is in BERT's); or ``{name: word_piece,
    vocabulary_size: N}``: a vocabulary of at most N tokens learned from the training split's texts (``[PAD]``
    first, then ``[UNK]``) and saved in the run folder (:mod:`accumrun.data.vocabulary`)."""

    keras_hub = True
    name: Literal["word_piece"]
    vocabulary: str | None = Field(None, min_length=1)
    vocabulary_size: int | None = Field(None, ge=MIN_LEARNED_VOCABULARY)
    lowercase: bool = True
    _tokens: tuple[str, ...] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _one_vocabulary(self) -> WordPieceTokenizerConfig:
        if (self.vocabulary is None) == (self.vocabulary_size is None):
            raise ValueError(
                "set one of vocabulary (a file) and vocabulary_size (learned from the training texts)"
                + (", not both" if self.vocabulary is not None else "")
            )
        return self

    @property
    def learned(self) -> bool:
        """Whether the vocabulary is learned from the training texts (``vocabulary_size``), not read from a file."""
        return self.vocabulary_size is not None

    @property
    def tokens(self) -> tuple[str, ...] | None:
        """A learned vocabulary's tokens, once :func:`accumrun.data.vocabulary.settle_vocabulary` has learned or
        read them (never from YAML: ``config.yaml`` records ``vocabulary_size``); None before, and for a file."""
        return self._tokens

    def with_tokens(self, tokens: tuple[str, ...]) -> WordPieceTokenizerConfig:
        """This section with its learned vocabulary's ``tokens`` settled."""
        settled = self.model_copy()
        settled._tokens = tokens
        return settled

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        identity: dict[str, object] = {"name": self.name, "lowercase": self.lowercase}
        if self.tokens is not None:
            identity["tokens"] = hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()
        else:
            assert self.vocabulary is not None  # the schema takes one of the two
            identity["vocabulary"] = file_hash(Path(self.vocabulary))
        return identity


class PresetTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: preset, path: FOLDER}``: the tokenizer of a KerasHub preset saved in a local folder (its
    ``tokenizer.json`` and assets); its id 0 must be its padding token."""

    keras_hub = True
    name: Literal["preset"]
    path: str = Field(min_length=1)

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        folder = Path(self.path)
        files = [folder / "tokenizer.json", *sorted((folder / "assets").rglob("*"))]
        return {"name": self.name, "files": {str(f.relative_to(folder)): file_hash(f) for f in files if f.is_file()}}


TOKENIZERS: dict[str, type[_Section]] = {
    "byte": ByteTokenizerConfig,
    "character": CharacterTokenizerConfig,
    "word_piece": WordPieceTokenizerConfig,
    "preset": PresetTokenizerConfig,
}
"""Every ``data.tokenizer.name`` and its section."""


class _UnknownTokenizerConfig(_Tokenizer):
    model_config = ConfigDict(extra="allow")
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError(f"input should be {_listed(list(TOKENIZERS))}")


def _tokenizer_kind(value: Any) -> str:
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return name if isinstance(name, str) and name in TOKENIZERS else "unknown"


TokenizerConfig = Annotated[
    Annotated[ByteTokenizerConfig, Tag("byte")]
    | Annotated[CharacterTokenizerConfig, Tag("character")]
    | Annotated[WordPieceTokenizerConfig, Tag("word_piece")]
    | Annotated[PresetTokenizerConfig, Tag("preset")]
    | Annotated[_UnknownTokenizerConfig, Tag("unknown")],
    Discriminator(_tokenizer_kind),
]
"""``data.tokenizer``: one section per tokenizer, chosen by ``name``."""

DEFAULT_SEQUENCE_LENGTH = 256


def _none_or_memory(value: Any, source: str, samples: str) -> Any:
    """``cache`` of a text source: token ids in memory, or the ``samples`` streamed; never on disk."""
    if value is CacheMode.DISK:
        raise ValueError(f"{source} keeps token ids in memory or streams its {samples}: none or memory")
    return value


def _refuse_image_keys(section: DataSection) -> None:
    for key in ("normalize", "augment"):
        if getattr(section, key):
            raise ValueError(f"{key} applies to images and arrays, not to text")


class CsvConfig(SampleWeights, FileSourceConfig):
    """``name: csv``: a table with a header row; the other numeric columns are the features."""

    needs = {"path": "the path of a .csv file", "label": "the name of the label column"}
    name: Literal["csv"]
    label: (
        Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    )
    """The label column, or several: 0/1 columns are the labels of a multi-label task (named by their columns),
    other numbers the targets of a regression."""
    id: str | None = None
    """A column that names each row (not a feature); ``predict`` on a CSV writes it as the ``input`` column."""
    text: str | None = Field(None, min_length=1)
    """A text column: set, each sample is its cell's ``sequence_length`` tokens, and no column is a feature."""
    tokenizer: TokenizerConfig | None = None
    """With ``text``: how its cells become token ids (default ``{name: byte}``)."""
    sequence_length: int | None = Field(None, ge=1)
    """With ``text``: tokens per sample (default 256), cut or padded with id 0."""
    bucket: int | None = Field(None, ge=1)
    """With ``text``: bucketed padding, as for the text sources (:attr:`TextSourceConfig.bucket`); it needs
    ``cache: memory``."""
    cache: Annotated[CacheMode, _words(CacheMode)] | None = None
    """With ``text`` (default ``none``): ``none`` streams, each row's text read back from the file and tokenized
    as the epoch's order reaches it; ``memory`` tokenizes every text at load and trains from the token ids in
    memory. A table of numbers is always held in memory and takes no ``cache``."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode | None) -> CacheMode | None:
        return _none_or_memory(value, "csv", "rows")

    @field_validator("bucket")
    @classmethod
    def _bucket_needs_text(cls, value: int | None, info: ValidationInfo) -> int | None:
        # ``text`` is validated before ``bucket`` (declared first); when it failed, its own error says so.
        if value is not None and "text" in info.data and info.data["text"] is None:
            raise ValueError("pads token ids: it applies to a text column; set data.text too")
        return value

    @model_validator(mode="after")
    def _text_keys(self) -> CsvConfig:
        if self.text is None:
            if self.tokenizer is not None or self.sequence_length is not None:
                raise ValueError("tokenizer and sequence_length apply to a text column: set data.text too")
            if self.cache is not None:
                raise ValueError(
                    "cache applies to a text column (a table of numbers is held in memory): set data.text too"
                )
            return self
        _refuse_image_keys(self)
        # Filled in here, not as field defaults, so a table of numbers records no tokenizer in its config.yaml.
        self.tokenizer = self.tokenizer or ByteTokenizerConfig(name="byte")
        self.sequence_length = self.sequence_length or DEFAULT_SEQUENCE_LENGTH
        self.cache = self.cache or CacheMode.NONE
        return self

    @property
    def label_columns(self) -> list[str]:
        """``label`` as a list of columns."""
        return [self.label] if isinstance(self.label, str) else list(self.label)

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        if self.text is None:
            return None
        assert self.tokenizer is not None and self.sequence_length is not None  # filled in with data.text
        return self.tokenizer, self.sequence_length

    @property
    def token_bucket(self) -> int | None:
        return self.bucket

    @property
    def id_column(self) -> str | None:
        return self.id

    @property
    def named_columns(self) -> tuple[str | None, ...]:
        return (*self.label_columns, self.id)


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


class TextSourceConfig(FileSourceConfig):
    """A source of UTF-8 text, each sample tokenized to ``sequence_length`` token ids."""

    tokenizer: TokenizerConfig = Field(default_factory=lambda: ByteTokenizerConfig(name="byte"))
    sequence_length: int = Field(DEFAULT_SEQUENCE_LENGTH, ge=1)
    """Tokens per sample: a longer text is cut, a shorter one padded with id 0 (masked in the model)."""
    bucket: int | None = Field(None, ge=1)
    """Pad each training sub-batch only to its longest text, rounded up to a multiple of this (at most
    ``sequence_length``), so that short sub-batches cost less; unset, every sub-batch keeps ``sequence_length``.
    With it, the samples within each batch are also ordered by their real length (a stable sort) before the batch
    is cut, so that each sub-batch holds texts of similar length (:mod:`accumrun.data.grouping`). Each batch holds
    the same samples either way, and padding is masked, so the update is the same. Dropout draws by a sample's row
    in the batch (:mod:`accumrun.core.draws`), so its masks differ with ``bucket`` and without; with ``bucket``,
    subdivided and plain training still draw alike."""

    @model_validator(mode="after")
    def _no_image_keys(self) -> TextSourceConfig:
        _refuse_image_keys(self)
        return self

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        return self.tokenizer, self.sequence_length

    @property
    def token_bucket(self) -> int | None:
        return self.bucket


class TextFolderConfig(TextSourceConfig):
    """``name: text_folder``: one subfolder of UTF-8 ``.txt`` files per class (the layout
    ``keras.utils.text_dataset_from_directory`` reads), tokenized to ``sequence_length`` token ids."""

    needs = {"path": "a folder with one subfolder of .txt files per class"}
    labelled_files = True
    name: Literal["text_folder"]
    cache: Annotated[CacheMode, _words(CacheMode)] = CacheMode.NONE
    """``none`` streams: each file is read and tokenized as the epoch's order reaches it. ``memory`` tokenizes each
    split once, at load, and trains from the token ids in memory: faster, for a folder whose ids fit."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode) -> CacheMode:
        return _none_or_memory(value, "text_folder", "files")

    @property
    def cache_wrapper(self) -> tuple[CacheMode, str]:
        return self.cache, ""


class JsonlConfig(TextSourceConfig):
    """``name: jsonl``: one JSON object per line, its ``text`` key tokenized and its ``label`` key the target."""

    needs = {"path": "the path of a .jsonl file", "label": "the key of each object's label"}
    name: Literal["jsonl"]
    text: str = Field("text", min_length=1)
    """The key of each object's text."""
    label: str = Field(min_length=1)
    """The key of each object's label: class names (numbered in sorted order), class indices or numbers."""
    cache: Annotated[CacheMode, _words(CacheMode)] = CacheMode.NONE
    """``none`` streams: each line's text is read back from the file and tokenized as the epoch's order reaches
    it. ``memory`` tokenizes every text once, at load, and trains from the token ids in memory (``bucket`` needs
    it)."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode) -> CacheMode:
        return _none_or_memory(value, "jsonl", "lines")


class TextCorpusConfig(TextSourceConfig):
    """``name: text_corpus``: plain UTF-8 ``.txt`` files (a file, a folder of them, or a glob) for a language model,
    each cut into windows of ``sequence_length`` input tokens, ``stride`` tokens apart; the targets are the same
    tokens one position on."""

    needs = {"path": "a .txt file, a folder of .txt files, or a glob of them"}
    stride: int | None = Field(None, ge=1)
    """Tokens between the starts of two windows; unset, ``sequence_length`` (windows that do not overlap)."""
    cache: Annotated[CacheMode, _words(CacheMode)] = CacheMode.NONE
    """``none`` tokenizes the corpus at load and holds its windows in memory. ``disk`` tokenizes it once into a
    token file under ``cache_dir``, found again by later runs over the same files, and reads each window from it as
    the epoch's order reaches it: memory grows by about 40 bytes a window, not with the text (see
    :mod:`accumrun.data.corpus`)."""
    cache_dir: str = Field("~/.cache/accumrun/", min_length=1)
    """Where ``cache: disk`` writes (``~`` is expanded): one folder per corpus, named by its files and the
    tokenizer."""

    @field_validator("cache")
    @classmethod
    def _none_or_disk(cls, value: CacheMode) -> CacheMode:
        if value is CacheMode.MEMORY:
            raise ValueError(
                "text_corpus holds its windows in memory (none) or reads them from a token file under "
                "data.cache_dir (disk)"
            )
        return value

    @property
    def window_stride(self) -> int:
        """``stride``, or ``sequence_length`` when it is unset."""
        return self.stride if self.stride is not None else self.sequence_length


class TokensConfig(FileSourceConfig):
    """``name: tokens``: a flat binary file of token ids (nanoGPT's ``train.bin``), ids 0 to ``vocabulary_size - 1``,
    cut into windows as ``text_corpus`` cuts its texts (see :mod:`accumrun.data.tokens`)."""

    needs = {
        "path": "a flat binary file of token ids, such as nanoGPT's train.bin",
        "vocabulary_size": "how many ids the file's vocabulary has (every id is below it)",
    }
    name: Literal["tokens"]
    dtype: Literal["uint16", "uint32"] = "uint16"
    """How each id is stored: little-endian ``uint16`` (nanoGPT's), or ``uint32`` for a larger vocabulary."""
    vocabulary_size: int = Field(ge=1)
    """The file's vocabulary; the model's embedding gets one id more, accumrun's padding id 0."""
    sequence_length: int = Field(DEFAULT_SEQUENCE_LENGTH, ge=1)
    stride: int | None = Field(None, ge=1)
    """Tokens between the starts of two windows; unset, ``sequence_length`` (windows that do not overlap)."""
    tokenizer: TokenizerConfig | None = None
    """For decoding only (``generate``, ``predict``): the tokenizer whose ids, shifted up by one, the file holds."""

    @model_validator(mode="after")
    def _no_image_keys(self) -> TokensConfig:
        _refuse_image_keys(self)
        if getattr(self.tokenizer, "learned", False):
            raise ValueError(
                "tokenizer: the file is tokenized already; a tokenizer here only decodes, so it needs its vocabulary "
                "(a file or a preset), not a size to learn"
            )
        return self

    @property
    def window_stride(self) -> int:
        """``stride``, or ``sequence_length`` when it is unset."""
        return self.stride if self.stride is not None else self.sequence_length

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        return None if self.tokenizer is None else (self.tokenizer, self.sequence_length)


DATA_SECTIONS: dict[str, type[DataSection]] = {
    "digits": DigitsConfig,
    "npz": NpzConfig,
    "mnist": IdxConfig,
    "fashion_mnist": IdxConfig,
    "synthetic": SyntheticConfig,
    "image_folder": ImageFolderConfig,
    "tfrecord": TfrecordConfig,
    "csv": CsvConfig,
    "tfds": TfdsConfig,
    "text_folder": TextFolderConfig,
    "text_corpus": TextCorpusConfig,
    "jsonl": JsonlConfig,
    "tokens": TokensConfig,
}
"""Every ``data.name`` and its section, in the order the docs list them."""


class _UnknownDataConfig(DataSection):
    model_config = ConfigDict(extra="allow")
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError(f"input should be {_listed(list(DATA_SECTIONS))}")


def _data_kind(value: Any) -> str:
    name = value.get("name", "digits") if isinstance(value, dict) else getattr(value, "name", None)
    return name if isinstance(name, str) and name in DATA_SECTIONS else "unknown"


DataConfig = Annotated[
    Annotated[DigitsConfig, Tag("digits")]
    | Annotated[NpzConfig, Tag("npz")]
    | Annotated[IdxConfig, Tag("mnist")]
    | Annotated[IdxConfig, Tag("fashion_mnist")]
    | Annotated[SyntheticConfig, Tag("synthetic")]
    | Annotated[ImageFolderConfig, Tag("image_folder")]
    | Annotated[TfrecordConfig, Tag("tfrecord")]
    | Annotated[CsvConfig, Tag("csv")]
    | Annotated[TfdsConfig, Tag("tfds")]
    | Annotated[TextFolderConfig, Tag("text_folder")]
    | Annotated[TextCorpusConfig, Tag("text_corpus")]
    | Annotated[JsonlConfig, Tag("jsonl")]
    | Annotated[TokensConfig, Tag("tokens")]
    | Annotated[_UnknownDataConfig, Tag("unknown")],
    Discriminator(_data_kind),
]
"""The ``data`` section: one section per source, chosen by ``name`` (``digits`` when it is unset)."""

_DATA_ADAPTER: TypeAdapter[DataConfig] = TypeAdapter(DataConfig)


def data_config(**keys: Any) -> DataSection:
    """The ``data`` section for ``keys`` (``name`` picks the source), validated as in a config file.

    Raises:
        pydantic.ValidationError: a key the source does not read, or a bad value.
    """
    return _DATA_ADAPTER.validate_python(keys)


def readers_of(key: str) -> list[str]:
    """The ``data.name`` values whose section has ``key``."""
    return [name for name, section in DATA_SECTIONS.items() if key in section.model_fields]


class DarknetCnnConfig(_Section):
    name: Literal["darknet_cnn"] = "darknet_cnn"
    filters: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [32, 64, 96], min_length=1)
    strides: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [2, 2, 1], min_length=1)
    leaky_alpha: float = Field(0.1, ge=0)


class MlpConfig(_Section):
    name: Literal["mlp"]
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    dropout: float = Field(0.0, ge=0, lt=1)


class TransformerConfig(_Section):
    """``name: transformer``: a Transformer encoder over token ids (a text source's), pooled over the real tokens
    into logits."""

    name: Literal["transformer"]
    layers: int = Field(2, ge=1)
    heads: int = Field(2, ge=1)
    width: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerConfig:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads ({self.heads})")
        return self


class CustomModelConfig(BaseModel):
    """``name: package.module:function``; every other key is passed to the function as a keyword."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


APPLICATION_PREFIX = "keras.applications."


class ApplicationConfig(BaseModel):
    """``name: keras.applications.<Constructor>``: a Keras application, by default without its classifier and
    with a new head sized to the task; every other key is passed to the constructor (``alpha``, ...)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(pattern=r"^keras\.applications\.[A-Za-z_]\w*$")
    weights: str | None = None
    """None (random), ``imagenet`` (Keras downloads them) or the path of a weights file."""
    include_top: bool = False
    pooling: Literal["avg", "max"] | None = "avg"
    freeze_base: bool = False

    @property
    def constructor(self) -> str:
        """The constructor's name in ``keras.applications``, such as ``MobileNetV2``."""
        return self.name.removeprefix(APPLICATION_PREFIX)

    @property
    def keywords(self) -> dict[str, Any]:
        """The constructor's other keyword arguments."""
        return dict(self.model_extra or {})


KERAS_HUB_PREFIX = "keras_hub.models."


class KerasHubConfig(BaseModel):
    """``name: keras_hub.models.<Name>Backbone``: a KerasHub backbone over token ids, with a head for the task;
    ``preset`` loads one from a local folder, else every other key is passed to the constructor (randomly
    initialized; ``vocabulary_size`` and ``max_sequence_length`` default to the tokenizer's and
    ``data.sequence_length``)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(pattern=r"^keras_hub\.models\.[A-Za-z_]\w*$")
    preset: str | None = None
    """A folder that ``save_to_preset`` wrote (nothing is downloaded)."""

    @property
    def constructor(self) -> str:
        """The class name in ``keras_hub.models``, such as ``GPT2Backbone``."""
        return self.name.removeprefix(KERAS_HUB_PREFIX)

    @property
    def keywords(self) -> dict[str, Any]:
        """The constructor's keyword arguments."""
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _preset_or_keys(self) -> KerasHubConfig:
        if self.preset is not None and self.model_extra:
            raise ValueError(f"a preset is loaded as saved: drop {', '.join(sorted(self.model_extra))}")
        return self


class SavedModelConfig(_Section):
    """``name: saved``: a model a user saved with Keras (``.keras`` or ``.h5``), trained as it is."""

    name: Literal["saved"]
    path: str


class _UnknownModelConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError(
            "unknown model; use darknet_cnn, mlp, transformer, keras.applications.<Name>, "
            "keras_hub.models.<Name>Backbone, saved or 'package.module:function'"
        )


MODEL_SECTIONS: dict[str, type[BaseModel]] = {
    "darknet_cnn": DarknetCnnConfig,
    "mlp": MlpConfig,
    "transformer": TransformerConfig,
    "application": ApplicationConfig,
    "keras_hub": KerasHubConfig,
    "saved": SavedModelConfig,
    "custom": CustomModelConfig,
    "unknown": _UnknownModelConfig,
}


def _model_kind(value: Any) -> str:
    name = value.get("name", "darknet_cnn") if isinstance(value, dict) else getattr(value, "name", None)
    if name in ("darknet_cnn", "mlp", "saved", "transformer"):
        return str(name)
    if isinstance(name, str) and name.startswith(APPLICATION_PREFIX):
        return "application"
    if isinstance(name, str) and name.startswith(KERAS_HUB_PREFIX):
        return "keras_hub"
    if isinstance(name, str) and ":" in name:
        return "custom"
    return "unknown"


ModelConfig = Annotated[
    Annotated[DarknetCnnConfig, Tag("darknet_cnn")]
    | Annotated[MlpConfig, Tag("mlp")]
    | Annotated[TransformerConfig, Tag("transformer")]
    | Annotated[ApplicationConfig, Tag("application")]
    | Annotated[KerasHubConfig, Tag("keras_hub")]
    | Annotated[SavedModelConfig, Tag("saved")]
    | Annotated[CustomModelConfig, Tag("custom")]
    | Annotated[_UnknownModelConfig, Tag("unknown")],
    Discriminator(_model_kind),
]


class LossConfig(BaseModel):
    """The loss: any ``keras.losses`` loss by snake_case or class name, or ``package.module:function`` returning
    one value per sample; other keys (``label_smoothing``, ``delta``, ``from_logits``, ...) are its keywords.
    Unset, it follows the task: sparse categorical cross-entropy for class labels, binary cross-entropy for
    multi-label targets; regression needs one named."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str | None = None
    from_logits: bool | None = None
    """Unset, it is read from the model: False when its output layer is a softmax or sigmoid."""

    @property
    def keywords(self) -> dict[str, Any]:
        """The loss's other keyword arguments (``from_logits`` is decided separately)."""
        return dict(self.model_extra or {})


class MetricConfig(BaseModel):
    """A ``keras.metrics`` metric by name, with its keyword arguments: ``{name: top_k_categorical_accuracy, k: 5}``."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str

    @property
    def keywords(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


MetricEntry = str | MetricConfig


UNION_SECTIONS: dict[str, dict[str, type[BaseModel]]] = {
    "model": MODEL_SECTIONS,
    "data": {**DATA_SECTIONS, "unknown": _UnknownDataConfig},
}
"""The sections of each union by their tag, which pydantic adds to an error's location."""
KEY_UNION_SECTIONS: dict[str, dict[str, type[BaseModel]]] = {
    "tokenizer": {**TOKENIZERS, "unknown": _UnknownTokenizerConfig}
}
"""The sections of the unions nested inside a section, by their key (``data.tokenizer``), then by their tag."""
UNION_TAGS = {
    **{key: set(sections) for key, sections in (UNION_SECTIONS | KEY_UNION_SECTIONS).items()},
    "learning_rate": {"rate", "schedule"},
}


class Watched(_Section):
    """A logged figure to watch (``loss``, ``val_accuracy``, ...): ``auto`` minimizes names with "loss" or
    "error" in them and maximizes the others."""

    monitor: str = "val_loss"
    mode: Annotated[Literal["auto"] | Direction, _words(Direction, auto=True)] = "auto"

    @property
    def minimize(self) -> bool:
        """Whether lower is better for the monitored figure."""
        if self.mode == "auto":
            return "loss" in self.monitor or "error" in self.monitor
        return self.mode == Direction.MIN


class EarlyStoppingConfig(Watched):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs."""

    patience: int = Field(5, ge=1)
    min_delta: float = Field(0.0, ge=0)


class ReduceOnPlateauConfig(Watched):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved by more than ``min_delta`` for
    ``patience`` epochs; then wait ``cooldown`` epochs; never below ``min_lr``. A change applies from the next
    epoch's first update."""

    factor: float = Field(0.5, gt=0, lt=1)
    patience: int = Field(3, ge=1)
    min_delta: float = Field(0.0, ge=0)
    cooldown: int = Field(0, ge=0)
    min_lr: float = Field(0.0, ge=0)


class KeepBestConfig(Watched):
    """Keep ``model.best.keras`` from the epoch with the best ``monitor``."""


class TrainingConfig(_Section):
    epochs: int = Field(10, ge=1)
    batch_size: int | Literal["full"] = 256
    subdivisions: int | Literal["auto"] = 1
    max_sub_batch: int | None = Field(None, ge=1)
    drop_remainder: bool = False
    on_nonfinite: Annotated[OnNonFinite, _words(OnNonFinite)] = OnNonFinite.STOP
    jit_compile: bool = False
    precision: Annotated[Precision, _words(Precision)] = Precision.FLOAT32
    early_stopping: EarlyStoppingConfig | None = None
    batch_norm: Annotated[BatchNormMode, _words(BatchNormMode)] = BatchNormMode.PER_BATCH
    """What BatchNorm layers normalize with and when their moving statistics move (see
    :mod:`accumrun.core.batch_norm`)."""
    random_draws: Annotated[RandomDraws, _words(RandomDraws)] = RandomDraws.PER_SAMPLE
    """How dropout and noise layers draw in training (see :mod:`accumrun.core.seeds`): ``per_sample`` makes
    subdivided training equal plain training with them; ``per_sub_batch`` is how runs before it drew."""
    precise_bn_samples: int | None = Field(None, ge=1)
    """``batch_norm: precise``: the training samples (a seeded subset) that each epoch's population statistics
    are computed over; all of them by default."""
    updates_per_call: int | Literal["auto"] = "auto"
    """The most updates one compiled call may run, where the training data is held on the device; ``auto`` sizes
    a call to about half a second of work. A call always ends where the host is needed (a checkpoint, a log point,
    validation, an epoch's end that a control decides at)."""
    validate_every: int = Field(1, ge=1)
    """Validate after every N-th epoch, and after the last."""
    class_weight: dict[str, float] | Literal["balanced"] | None = None
    """Class labels only: each class's name (as ``labels.json`` records it) and the weight its samples' losses
    are multiplied by in training (unnamed classes 1.0), or ``balanced``: n_samples / (n_classes * count) over the
    training split. Not applied to validation, as Keras' ``class_weight``."""

    @field_validator("class_weight", mode="before")
    @classmethod
    def _class_weights(cls, value: Any) -> Any:
        if value is None or value == "balanced":
            return value
        if not isinstance(value, dict) or not value:
            raise ValueError("must be a mapping {class name: weight, ...} or 'balanced'")
        weights = {}
        for name, weight in value.items():
            # YAML reads class indices as numbers; labels.json names them as text.
            key = str(name) if isinstance(name, int) and not isinstance(name, bool) else name
            if not isinstance(key, str):
                raise ValueError(f"class names must be text or class indices, got {name!r}")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < float("inf"):
                raise ValueError(f"class {key!r}: a weight must be a finite number >= 0, got {weight!r}")
            weights[key] = float(weight)
        return weights

    @field_validator("batch_size", mode="before")
    @classmethod
    def _positive_or_full(cls, value: Any) -> Any:
        if value == "full":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("must be a positive integer or 'full' (the whole training set)")
        return value

    @field_validator("subdivisions", mode="before")
    @classmethod
    def _positive_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("must be a positive integer or 'auto' (find the fewest that fit in memory)")
        return value

    @field_validator("updates_per_call", mode="before")
    @classmethod
    def _updates_positive_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("must be a positive integer or 'auto' (about half a second of work per call)")
        return value

    @property
    def fixed_subdivisions(self) -> int | None:
        """``subdivisions`` when it is a number; None while it is ``auto`` (not settled yet)."""
        return self.subdivisions if isinstance(self.subdivisions, int) else None


class ScheduleConfig(BaseModel):
    """A Keras learning-rate schedule by name; other keys are its keyword arguments."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str


def _rate_kind(value: Any) -> str:
    return "schedule" if isinstance(value, dict | ScheduleConfig) else "rate"


LearningRate = Annotated[
    Annotated[float, Tag("rate")] | Annotated[ScheduleConfig, Tag("schedule")],
    Discriminator(_rate_kind),
]


class OptimizerConfig(BaseModel):
    """A Keras optimizer by name; other keys are its keyword arguments, checked when it is built."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = "adam"
    learning_rate: LearningRate = 0.001
    reduce_on_plateau: ReduceOnPlateauConfig | None = None

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _positive_or_schedule(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError("must be a positive number or a schedule mapping with a 'name'")
        return float(value)

    @property
    def keywords(self) -> dict[str, Any]:
        """The keyword arguments for the optimizer besides ``name``, ``learning_rate`` and ``reduce_on_plateau``."""
        return dict(self.model_extra or {})


_DURATION_UNITS = {"s": 1, "min": 60, "h": 3600}


def duration_seconds(text: str) -> float:
    """``90s``, ``10min``, ``1.5h`` in seconds.

    Raises:
        ValueError: not a positive number followed by ``s``, ``min`` or ``h``.
    """
    for unit, seconds in _DURATION_UNITS.items():
        number = text.strip().removesuffix(unit)
        if number != text.strip():
            try:
                value = float(number)
            except ValueError:
                break
            if value > 0:
                return value * seconds
    raise ValueError("must be a duration such as 90s, 10min or 1h, or null for the ends of epochs only")


class OutputConfig(_Section):
    run_dir: str = "runs/{config_name}-{timestamp}"
    tensorboard: bool = True
    log_every_updates: int | None = Field(None, ge=1)
    checkpoint_every: str | None = "10min"
    """How often a checkpoint is written, as a duration; None at the end of every epoch. Whatever it says, one is
    also written at every stop, signal and the end of the run."""
    checkpoint_every_updates: int | None = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    keep_best: str | KeepBestConfig | None = None
    """A logged figure (``val_loss``), or ``{monitor: ..., mode: ...}``: keep ``model.best.keras`` from its best
    epoch."""

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            duration_seconds(value if isinstance(value, str) else "")
        return value

    @property
    def checkpoint_seconds(self) -> float | None:
        """``checkpoint_every`` in seconds; None for the end of every epoch."""
        return None if self.checkpoint_every is None else duration_seconds(self.checkpoint_every)

    @property
    def best(self) -> KeepBestConfig | None:
        """``keep_best`` as a monitor and mode."""
        return KeepBestConfig(monitor=self.keep_best) if isinstance(self.keep_best, str) else self.keep_best


class DistributeConfig(_Section):
    """Where the replicas of the step run: one device (``none``), the local GPUs (``mirrored``), or several hosts
    (``multi_worker``, cluster from ``TF_CONFIG`` or Slurm). ``auto`` is ``mirrored`` with more than one GPU, else
    ``none``."""

    strategy: Annotated[Literal["auto"] | Strategy, _words(Strategy, auto=True)] = Strategy.NONE
    logical_cpus: int | None = Field(None, ge=1)
    cluster: Annotated[Literal["auto"] | Cluster, _words(Cluster, auto=True)] = "auto"
    """``multi_worker``: where the cluster is described: ``TF_CONFIG``, Slurm's variables, or whichever is set."""
    timeout_seconds: int = Field(300, ge=1)
    """``multi_worker``: how long a collective waits for a worker that stopped answering before the run ends."""


class Config(_Section):
    seed: int = Field(0, ge=0)
    data: DataConfig = Field(default_factory=DigitsConfig)
    model: ModelConfig = Field(default_factory=DarknetCnnConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    metrics: list[MetricEntry] | None = None
    """Unset, they follow the task: accuracy, binary accuracy, or the mean absolute error for regression."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    distribute: DistributeConfig = Field(default_factory=DistributeConfig)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML, loadable again by :func:`load_config`."""
        resolved = self.model_dump(mode="json")
        if self.data.validation_file:
            # The second file validates; a split would be refused beside it on loading.
            resolved["data"]["validation_split"] = 0.0
        return yaml.safe_dump(resolved, sort_keys=False)

    def with_subdivisions(self, subdivisions: int | Literal["auto"]) -> Config:
        """A copy with ``training.subdivisions`` set (as ``auto`` settles it, or as a variant asks)."""
        training = self.training.model_copy(update={"subdivisions": subdivisions})
        return self.model_copy(update={"training": training})


def cross_field_problems(config: Config) -> list[str]:
    """Rules that span several keys; the per-key rules, and which keys each data source reads, live in the
    sections."""
    return [
        *_batch_problems(config.training),
        *_data_problems(config.data),
        *_weight_problems(config),
        *_model_problems(config),
        *_distribute_problems(config),
    ]


def _batch_problems(training: TrainingConfig) -> list[str]:
    subdivisions = training.fixed_subdivisions
    if isinstance(training.batch_size, int) and subdivisions is not None and subdivisions > training.batch_size:
        return [
            describe(
                "training.subdivisions",
                f"cannot exceed training.batch_size ({training.batch_size}); each sub-batch needs a sample",
                training.subdivisions,
            )
        ]
    return []


def _data_problems(data: DataSection) -> list[str]:
    """A validation file and a validation split at once: which would validate?"""
    files = bool(data.validation_file)
    if files and "validation_split" in data.model_fields_set and data.validation_split != 0:
        return [
            describe(
                "data.validation_split",
                "cannot be set with data.validation_path; use one",
                data.validation_split,
            )
        ]
    return []


def _weight_problems(config: Config) -> list[str]:
    """Sample weights and class weights at once (Keras refuses both too), and a weight column that is already
    the label or the id."""
    weight = getattr(config.data, "weight", None)
    problems = []
    if weight is not None and config.training.class_weight is not None:
        problems.append(
            describe(
                "training.class_weight",
                "cannot be set with data.weight; multiply the class weights into the weight column or array",
                config.training.class_weight,
            )
        )
    data = config.data
    if weight is not None and weight in data.named_columns:
        problems.append(describe("data.weight", "must be a column of its own, not the label or id column", weight))
    return problems


def _model_problems(config: Config) -> list[str]:
    """The model's keys against each other, and the learning rate against the plateau control."""
    problems = []
    model = config.model
    if isinstance(model, DarknetCnnConfig) and len(model.filters) != len(model.strides):
        problems.append(
            describe(
                "model.strides",
                f"needs one stride per entry of model.filters ({len(model.filters)})",
                model.strides,
            )
        )
    if isinstance(model, ApplicationConfig) and model.freeze_base and model.include_top:
        problems.append(
            describe("model.freeze_base", "trains a new head on a frozen base; it needs include_top: false", True)
        )
    optimizer = config.optimizer
    if optimizer.reduce_on_plateau is not None and isinstance(optimizer.learning_rate, ScheduleConfig):
        problems.append(
            describe(
                "optimizer.reduce_on_plateau",
                f"cannot change a learning-rate schedule ({optimizer.learning_rate.name}); use a number",
                optimizer.reduce_on_plateau.monitor,
            )
        )
    return problems


def _distribute_problems(config: Config) -> list[str]:
    """What cannot run with the chosen ``distribute.strategy``."""
    problems = []
    distribute = config.distribute
    strategy = str(distribute.strategy)
    if config.data.feed == Feed.SUB_BATCH and distribute.strategy not in ("auto", Strategy.NONE):
        problems.append(
            describe(
                "data.feed",
                f"sub_batch streams on one device, not with distribute.strategy: {strategy}",
                Feed.SUB_BATCH.value,
            )
        )
    if distribute.logical_cpus is not None and distribute.strategy != Strategy.MIRRORED:
        problems.append(
            describe(
                "distribute.logical_cpus",
                f"splits the CPU into replicas for distribute.strategy: mirrored, not {strategy}",
                distribute.logical_cpus,
            )
        )
    if config.training.precision == Precision.MIXED_FLOAT16 and distribute.strategy != Strategy.NONE:
        # The replicated step does not scale the loss; float16 gradients would underflow unnoticed.
        problems.append(
            describe(
                "training.precision",
                "mixed_float16 (loss scaling) runs on one device only; use mixed_bfloat16 with distribute",
                Precision.MIXED_FLOAT16.value,
            )
        )
    return problems
