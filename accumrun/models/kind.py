"""What every kind of model shares: the base of its config section, what a build is asked for, how a ``model.name``
selects the kind, and the entry that registers it in :data:`accumrun.models.registry.MODELS`.

Nothing here imports TensorFlow: the sections are read whenever a config is loaded. Builds import Keras when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from accumrun.sections import Section

if TYPE_CHECKING:
    import keras


class LoraConfig(Section):
    """``model.lora``: low-rank adapters (Keras' ``enable_lora``) on the Dense and EinsumDense layers that
    ``targets`` names; only they train, the rest of the model is frozen (:mod:`accumrun.models.lora`)."""

    rank: int = Field(ge=1)
    alpha: float | None = Field(None, gt=0)
    """The adapters' output is scaled by ``alpha / rank``; unset, ``alpha`` is ``rank`` (Keras' default)."""
    targets: list[str] | None = Field(None, min_length=1)
    """Layer-name patterns (``fnmatch``, against a layer's name or its path such as ``attention_0/query``); unset,
    the attention's query and value projections where the model has attention, else every Dense."""


class ModelSection(BaseModel):
    """The ``model`` section of one kind; each kind's section adds its own keys (and a ``Section`` or ``Keywords``
    base for whether it takes keys it does not declare)."""

    trained_before_key: ClassVar[dict[str, Any]] = {}
    """Keys added since runs were first written, each with the value that a run whose config.yaml lacks it trained
    with (its default then); a resumed run keeps what it had."""

    name: str
    lora: LoraConfig | None = None
    quantize: Literal["int8"] | None = None
    """The frozen base held in int8 (Keras' ``quantize("int8")``), trained through ``lora``."""
    adapters: str | None = None
    """An ``adapters.weights.h5`` that a LoRA run saved: the adapters start from it."""

    def adaptation_rules(self) -> Iterator[tuple[str, str, Any]]:
        """The rules of ``quantize`` and ``adapters``, which train only through ``lora`` (every kind has them)."""
        if self.lora is None and self.quantize is not None:
            yield (
                "model.quantize",
                "an int8 layer does not train itself: set model.lora to train adapters",
                self.quantize,
            )
        if self.lora is None and self.adapters is not None:
            yield "model.adapters", "adapters start a LoRA run: set model.lora", self.adapters

    def broken_rules(self) -> Iterator[tuple[str, str, Any]]:
        """Each rule across this section's keys that the values break, as the key to blame, what is wrong and the
        value given (run with the config's other cross-field rules, once every key is valid)."""
        return iter(())


SectionT = TypeVar("SectionT", bound=ModelSection)


@dataclass(frozen=True)
class BuildRequest:
    """What a model is built for: samples of ``sample_shape`` and ``outputs`` outputs (one per class or label, or
    per target value). ``vocabulary_size`` is a text source's, for models of token ids; ``per_position`` asks for
    ``outputs`` at every position of a sequence (a language model, causally masked), and ``any_length`` for a model
    of token ids that takes sequences of any length (bucketed padding)."""

    sample_shape: tuple[int, ...]
    outputs: int
    vocabulary_size: int | None = None
    per_position: bool = False
    any_length: bool = False


@dataclass(frozen=True)
class Naming:
    """How a ``model.name`` selects a kind."""

    shown: str
    """The names as the refusal of an unknown one lists them: ``mlp``, ``keras.applications.<Name>``."""
    selects: Callable[[str], bool]


def exactly(name: str) -> Naming:
    """The kind of one name."""
    return Naming(name, name.__eq__)


def prefixed(prefix: str, shown: str) -> Naming:
    """The kind of every name that starts with ``prefix``."""
    return Naming(shown, lambda name: name.startswith(prefix))


@dataclass(frozen=True)
class ModelKind(Generic[SectionT]):
    """One kind of model: its section, how a name selects it, its build, and what it declares."""

    section: type[SectionT]
    naming: Naming
    build: Callable[[SectionT, BuildRequest], keras.Model]
    """The model, with logits at a new head (raising ``ConfigError`` or ``DataError`` where it cannot be built)."""
    token_ids: bool = False
    """Whether it reads token ids, and so needs a text source."""
    attention: bool | None = False
    """Whether it has attention layers (and so blocks to recompute, and query and value projections to adapt);
    None where that depends on the model, and only the built model tells."""
    blocks: Callable[[keras.Model], list[Any]] | None = None
    """Its blocks in a built model, for ``training.remat: blocks`` (:mod:`accumrun.models.blocks`); None where it has
    none, and ``blocks`` is refused."""
    preprocessing: Callable[[SectionT], Callable[[Any], Any] | None] = lambda section: None
    """The input preprocessing the model was trained with, which ``data.rescale: auto`` applies (Keras ops on
    inputs of 0..255); None where it has none."""
