"""What every config section shares, whether it lives in :mod:`accumrun.config`, beside a data source's loader or
beside an optimizer's build: the strict pydantic base, the parsing of a closed set's words, of a number or a word,
and of the booleans' words, the watched figure of early stopping, the plateau and keep_best, the shape of a broken
cross-field rule, and the pieces of every union chosen by ``name`` (``data``, ``model``, ``data.tokenizer``). It
imports only ``kinds``, so that ``config``, ``optim`` and ``data`` can sit above it.
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, TypeAlias, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag, field_validator, model_validator

from accumrun.kinds import Direction, Kind


class Section(BaseModel):
    """A config section: strict types (YAML already typed the values) and no unknown keys. One word or number where
    a list is expected is a list of one (``--set training.measure=noise_scale``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _one_as_list(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        lists = [key for key, field in cls.model_fields.items() if _takes_list(field.annotation)]
        scalars = {key: [value[key]] for key in lists if isinstance(value.get(key), str | int | float)}
        return {**value, **scalars} if scalars else value


def _takes_list(annotation: Any) -> bool:
    """Whether a field takes a list (alone, or else None)."""
    if get_origin(annotation) in (Union, UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        return len(members) == 1 and _takes_list(members[0])
    return get_origin(annotation) is list


Problem: TypeAlias = tuple[str, str, Any]
"""A broken cross-field rule, as a section or a feature declares it: the key to blame, what is wrong, and the value
given (:func:`accumrun.config.schema.cross_field_problems` collects them in order)."""


class Unknown(BaseModel):
    """The member of a union by ``name`` for any other name: it takes any keys and refuses the name with
    :attr:`refusal`. A base after the union's own, so that its ``extra="allow"`` wins."""

    model_config = ConfigDict(extra="allow")
    refusal: ClassVar[str]
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError(cls.refusal)


def by_name(names: dict[str, Any], default: str | None = None) -> Discriminator:
    """A union's choice by ``name`` (``default`` when it is unset): the name itself, or ``unknown``."""

    def kind(value: Any) -> str:
        name = value.get("name", default) if isinstance(value, dict) else getattr(value, "name", None)
        return name if isinstance(name, str) and name in names else "unknown"

    return Discriminator(kind)


def tagged_union(members: dict[str, type[BaseModel]], choose: Discriminator) -> Any:
    """The union of ``members``, each under its tag (which pydantic adds to an error's location), chosen by
    ``choose``. Built at run time from a registry, so a type checker sees ``Any``: each union names its base."""
    return Annotated[Union[tuple(Annotated[section, Tag(tag)] for tag, section in members.items())], choose]  # noqa: UP007


def listed(words: list[str]) -> str:
    """``'a', 'b' or 'c'``: the allowed words, as an error message lists them."""
    *others, last = (repr(word) for word in words)
    return f"{', '.join(others)} or {last}" if others else last


def words(kind: type[Kind], *, auto: bool = False) -> BeforeValidator:
    """Parse a member of ``kind`` from its word (and ``auto`` where the key allows it), naming every allowed word
    when the value is none of them."""
    allowed = ["auto", *kind.words()] if auto else kind.words()

    def parse(value: Any) -> Any:
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"input should be {listed(allowed)}")
        return value if value == "auto" else kind(value)

    return BeforeValidator(parse)


def int_or(word: str, meaning: str) -> BeforeValidator:
    """A positive integer or ``word``, whose ``meaning`` the message gives."""

    def check(value: Any) -> Any:
        if value != word and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a positive integer or {word!r} ({meaning})")
        return value

    return BeforeValidator(check)


# YAML 1.1's words for a boolean besides true and false. The config is read as YAML 1.2, where only true and false
# are booleans (so a class called `yes` is text), and a boolean key takes these words as it always did.
_FLAG_WORDS = {
    **dict.fromkeys(("yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("no", "No", "NO", "off", "Off", "OFF"), False),
}


def as_flag(value: Any) -> Any:
    """``value``, or the boolean it names when it is one of YAML 1.1's words yes/no/on/off (in any of their cases)."""
    return _FLAG_WORDS.get(value, value) if isinstance(value, str) else value


Flag = Annotated[bool, BeforeValidator(as_flag)]
"""A boolean key: ``true``/``false``, or ``yes``/``no``/``on``/``off``."""


class Watched(Section):
    """A logged figure to watch: ``auto`` minimizes names with "loss" or "error" in them, maximizes the others."""

    monitor: str = "val_loss"
    mode: Annotated[Literal["auto"] | Direction, words(Direction, auto=True)] = "auto"

    @property
    def minimize(self) -> bool:
        """Whether lower is better for the monitored figure."""
        if self.mode == "auto":
            return "loss" in self.monitor or "error" in self.monitor
        return self.mode == Direction.MIN
