"""The ``data`` keys that every source reads (:class:`DataSection`), and the pieces that several sources' sections
share. Each source's own section lives beside its loader, registered in :mod:`accumrun.data.registry`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from accumrun.errors import ConfigError
from accumrun.kinds import CacheMode, ColorMode, Feed, Task
from accumrun.sections import Flag, Problem, Section, as_flag, words

if TYPE_CHECKING:
    from accumrun.data.tokenizers.base import TokenizerSection


class Keywords(BaseModel):
    """A section naming a Keras object (or a function) whose keys besides the declared ones are its keywords."""

    model_config = ConfigDict(extra="allow", strict=True)

    @property
    def keywords(self) -> dict[str, Any]:
        """The keys besides the declared ones: the keyword arguments."""
        return dict(self.model_extra or {})


class TextTable(Protocol):
    """A source whose samples are a table's texts (a CSV's text column, JSON Lines): ``predict`` reads a file laid
    out as its own row by row."""

    @property
    def name(self) -> str: ...

    def texts_of(self, path: Path) -> tuple[list[str], list[str] | None]:
        """The texts of a file laid out as this source's, and each row's id where it has one."""
        ...


class NormalizeConfig(Section):
    """``(x - mean) / std`` per channel, after ``rescale``: one value per channel, or one for all."""

    mean: list[float] = Field(min_length=1)
    std: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)


class AugmentConfig(Keywords):
    """A Keras image preprocessing layer by name (``random_flip``, ...); other keys are its keywords."""

    name: str


class DataSection(Section):
    """The ``data`` keys that every source reads; each source's section adds its own."""

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
    validation_split: float | Literal["test"] = 0.1
    shuffle: Flag = True
    task: Annotated[Literal["auto"] | Task, words(Task, auto=True)] = "auto"
    """``auto`` reads it from the targets, and makes two classes binary when the model has one output unit."""
    rescale: float | Literal["auto"] | bool = "auto"
    """A factor on the device: ``auto`` is 1/255 for uint8 images (1/16 for digits, none for floats), ``false`` none."""
    normalize: NormalizeConfig | None = None
    augment: list[AugmentConfig] = Field(default_factory=list)
    """Training only: Keras image preprocessing layers, drawn per (seed, epoch, sample)."""
    feed: Annotated[Literal["auto"] | Feed, words(Feed, auto=True)] = "auto"
    """``sub_batch`` streams one sub-batch at a time when a batch does not fit; ``auto`` follows the memory estimate."""

    @field_validator("path")
    @classmethod
    def _read_by_the_source(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not cls.reads_path:
            raise ValueError(f"is not used by data.name: {info.data.get('name')}")
        return value

    @field_validator("rescale", mode="before")
    @classmethod
    def _factor(cls, value: Any) -> Any:
        value = as_flag(value)  # `rescale: no` is false, as for a boolean key
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

    def broken_rules(self, *, class_weight: object) -> Iterator[Problem]:
        """A validation file beside a validation split, and ``data.weight`` beside ``training.class_weight`` (given as
        ``class_weight``) or on a column that holds something else."""
        # A validation file and a validation split at once: which would validate?
        if self.validation_file and "validation_split" in self.model_fields_set and self.validation_split != 0:
            yield "data.validation_split", "cannot be set with data.validation_path; use one", self.validation_split
        weight = getattr(self, "weight", None)
        if weight is not None and class_weight is not None:
            # Keras refuses both too.
            message = "cannot be set with data.weight; multiply the class weights into the weight column or array"
            yield "training.class_weight", message, class_weight
        if weight is not None and weight in self.named_columns:
            yield "data.weight", "must be a column of its own, not the label or id column", weight

    def reading(self, path: str) -> DataSection:
        """The same source reading all of ``path`` (no validation split): what ``evaluate --data`` scores.

        Raises:
            ConfigError: the source reads no file (``digits``, ``synthetic``, ``tfds``), so there is no other one to
                read.
        """
        if not self.reads_path:
            why = f"data.name: {self.name} reads no file; --data takes a file or folder of a source that does"
            raise ConfigError("data", why, path)
        return self.model_copy(update={"path": path, "validation_split": 0.0})

    @property
    def cache_wrapper(self) -> tuple[CacheMode, str]:
        """The mode and ``cache_dir`` of a cache that wraps the splits (:mod:`accumrun.data.cache`), else ``none``."""
        return CacheMode.NONE, ""

    @property
    def validation_file(self) -> str | None:
        """``data.validation_path``, where the source reads one."""
        return getattr(self, "validation_path", None)

    @property
    def text_settings(self) -> tuple[TokenizerSection, int] | None:
        """The tokenizer and sequence length of a source whose samples are text (a ``tokenizer`` is set), else None."""
        tokenizer: TokenizerSection | None = getattr(self, "tokenizer", None)
        return None if tokenizer is None else (tokenizer, getattr(self, "sequence_length", 0))

    @property
    def token_bucket(self) -> int | None:
        """``bucket`` of a source of token ids (bucketed padding), else None."""
        return getattr(self, "bucket", None)

    @property
    def id_column(self) -> str | None:
        """The column that names each row (a CSV's ``id``), else None."""
        return getattr(self, "id", None)

    @property
    def named_columns(self) -> tuple[str | None, ...]:
        """The columns that hold something else than a feature (a CSV's labels and id)."""
        return ()

    @property
    def text_table(self) -> TextTable | None:
        """This source where its samples are a table's texts, else None."""
        return None

    def header_features(self) -> list[str] | None:
        """The feature columns of ``data.path``'s header, for a table of numbers (a run from before ``features.json``
        recorded them); None for other sources."""
        return None


class SampleWeights(Section):
    """``data.weight``, for the sources whose samples can carry a weight each."""

    weight: str | None = Field(None, min_length=1)
    """Each sample's loss weight: an npz array (``w``, or ``w_train`` and ``w_test``), a CSV column (then no
    feature), or a TFRecord float feature."""


class FileSourceConfig(DataSection):
    """A source that reads files the user names: ``path``, and ``validation_path`` to validate on, if any."""

    path: str = Field(min_length=1)
    validation_path: str | None = None

    def reading(self, path: str) -> DataSection:
        return self.model_copy(update={"path": path, "validation_path": None, "validation_split": 0.0})


class ImageSourceConfig(DataSection):
    """A source of encoded images, decoded and resized to ``image_size`` as they stream."""

    images = True
    needs = {"image_size": "[height, width] to resize images to"}
    image_size: list[int]
    color_mode: Annotated[ColorMode, words(ColorMode)] = ColorMode.RGB
    cache: Annotated[CacheMode, words(CacheMode)] = CacheMode.NONE
    """Keep the decoded, resized images: ``memory`` decodes each split once at load, ``disk`` writes them under
    ``cache_dir`` (``~`` expanded), one folder per split, for this run and the next (:mod:`accumrun.data.cache`)."""
    cache_dir: str = Field("~/.cache/accumrun/", min_length=1)

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


DEFAULT_SEQUENCE_LENGTH = 256


def none_or_memory(source: str, samples: str) -> AfterValidator:
    """``cache`` of a text source: token ids in memory, or the ``samples`` streamed; never on disk."""

    def check(value: CacheMode) -> CacheMode:
        if value is CacheMode.DISK:
            raise ValueError(f"{source} keeps token ids in memory or streams its {samples}: none or memory")
        return value

    return AfterValidator(check)


def refuse_image_keys(section: DataSection) -> None:
    """Refuse ``normalize`` and ``augment`` on a source of text or token ids."""
    for key in ("normalize", "augment"):
        if getattr(section, key):
            raise ValueError(f"{key} applies to images and arrays, not to text")
