"""LoRA on any model (``model.lora``), over a base that may be held in int8 (``model.quantize: int8``).

The adapters are Keras' own (``enable_lora`` on ``Dense`` and ``EinsumDense``): the layer adds
``alpha / rank * x @ A @ B`` to its output, with ``B`` starting at zero, so training starts from the base's outputs.
Only the adapters train, as PEFT does by default: every other variable of the model, biases included, is frozen,
and BatchNorm layers run in inference mode (their ``frozen`` mode). The base is quantized before the adapters are
added, so they stay float32 over an int8 kernel (QLoRA's idea with Keras' int8; the inputs are quantized per row,
so a sample's output does not depend on the others in its sub-batch and accumulation stays exact).

The frozen base never changes in training, and it is rebuilt from the config: a LoRA run's checkpoints hold the
adapters and the model's random state alone (:func:`checkpointed_variables`).
"""

from __future__ import annotations

import contextlib
import gc
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from accumrun.errors import ConfigError
from accumrun.models.kind import LoraConfig, ModelSection

if TYPE_CHECKING:
    import keras

ATTENTION_PROJECTIONS = ("query", "value", "query_dense", "value_dense")
"""The names of the attention's query and value projections: Keras' ``MultiHeadAttention`` and KerasHub's
attention layers name them so (KerasHub's own ``enable_lora`` targets the same names)."""

_ADAPTER_WEIGHTS = ("lora_kernel_a", "lora_kernel_b")
_QUANTIZATION_SCALES = ("kernel_scale", "embeddings_scale")


def adapt(model: keras.Model, section: ModelSection, *, attention: bool | None) -> keras.Model:
    """``model`` (changed in place) with the base frozen, quantized as ``section.quantize`` says, and adapters on
    the layers ``section.lora.targets`` names (by default the attention's query and value projections, unless
    ``attention`` is False, the kind's declaration that it has none; else every Dense and EinsumDense).

    Raises:
        ConfigError: a pattern that matches no layer, a rank above a target's dimensions, or a target that
            already has adapters.
    """
    import keras

    lora = section.lora
    assert lora is not None, "adapt is called for a section with lora"
    targets = _targets(model, lora, attention)
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            # A BatchNorm layer that is not trainable normalizes with its moving statistics, in training too.
            layer.trainable = False
    for variable in model.trainable_variables:
        variable.trainable = False
    if section.quantize is not None:
        with warnings.catch_warnings(), _collecting_once():
            # Keras warns for every layer that has no int8 form (norms, dropout, the input): they stay as they are.
            warnings.simplefilter("ignore")
            model.quantize(section.quantize)
        _record_quantized_sublayers(model)
    wrap_int8_calls(model)  # also a base that was int8 already, such as a saved int8 model
    for layer in targets:
        layer.enable_lora(lora.rank, lora_alpha=lora.alpha)
    return model


@contextlib.contextmanager
def _collecting_once() -> Iterator[None]:
    """Inside, Python's garbage collections pass over every object made before; after, one collection frees what is
    left over.

    Keras' ``quantize`` runs a full collection for each kernel it replaces (``Layer.__delattr__``), over every object
    that TensorFlow, Keras and KerasHub have made. On ``benchmarks/lora_memory.py``'s 50M-parameter transformer that
    was 61 collections of 0.23 s, 14 of the 16.5 s that quantizing took; with the older objects frozen
    (``gc.freeze``) it took 0.78 s, at the same peak resident memory (1,042 MiB both ways). Where the process has
    frozen objects of its own, they are left as they are, and so are Keras' collections."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def wrap_int8_calls(model: keras.Model) -> None:
    """Wrap each quantized ``Dense`` and ``EinsumDense`` call twice over, on the layer object as remat's calls are, so
    ``model.keras`` is untouched: when a run adapts its base, and when a finished run's int8 model is loaded to serve.
    In each call:

    - its int8 product runs in float32 (:mod:`accumrun.models.int8_matmul`): TensorFlow's int8 matmul kernel exists
      only for the CPU, where it is slower than float32's;
    - in training, its backward pass waits for its gradient (:mod:`accumrun.core.deferred`): Keras' int8 layers
      dequantize their kernel for it from the kernel alone, so without the wait every layer's float32 kernel is made
      during the forward pass and held until the backward pass reaches it. A forward pass alone has no backward pass
      to wait.

    An int8 ``Embedding`` looks its rows up: it has no product, and needs no gradient of its frozen table. A layer
    wrapped already is left as it is."""
    import keras

    from accumrun.core.deferred import deferred_backward
    from accumrun.core.recompute import training_now
    from accumrun.models.int8_matmul import int8_products_in_float32

    for layer in model._flatten_layers(include_self=False, recursive=True):
        if layer.quantization_mode is None or not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            continue
        if "quantized_call" in vars(layer):  # Keras' own is the class's method
            continue
        original = layer.quantized_call

        def call(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with int8_products_in_float32():
                if not training_now():
                    return _original(*args, **kwargs)
                return deferred_backward(_original, args, kwargs)

        layer.quantized_call = call


def _record_quantized_sublayers(model: keras.Model) -> None:
    """Give each layer that makes quantized layers of its own (a ``MultiHeadAttention``'s projections) a policy map
    of them, Keras' ``DTypePolicyMap``, so that its saved config rebuilds them in int8 and ``model.keras`` loads. A
    model's own layers are saved one by one with their policies, and KerasHub's backbones write their map."""
    import keras

    def outermost(layer: Any) -> Iterator[Any]:
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if isinstance(child, keras.Model):
                yield from outermost(child)
            elif any(True for _ in child._flatten_layers(include_self=False, recursive=False)):
                yield child

    for layer in outermost(model):
        quantized = [sub for sub in layer._flatten_layers(include_self=False) if sub.quantization_mode is not None]
        if quantized:
            policies = keras.dtype_policies.DTypePolicyMap(default_policy=layer.dtype_policy)
            for sub in quantized:
                policies[sub.path] = sub.dtype_policy
            # Not the setter, which would quantize the layer itself.
            layer._dtype_policy = policies


def _targets(model: keras.Model, lora: LoraConfig, attention: bool | None) -> list[Any]:
    """The layers to adapt, in the model's order, each checked to take an adapter of ``lora.rank``."""
    candidates = list(_adaptable(model))
    if lora.targets is not None:
        for pattern in lora.targets:
            if not any(_matches(layer, pattern) for layer in candidates):
                names = ", ".join(layer.path for layer in candidates) or "none"
                raise ConfigError(
                    "model.lora.targets", f"{pattern!r} matches no layer; the Dense and EinsumDense layers are {names}"
                )
        targets = [layer for layer in candidates if any(_matches(layer, p) for p in lora.targets)]
    else:
        projections = [layer for layer in candidates if layer.name in ATTENTION_PROJECTIONS]
        targets = projections if attention is not False and projections else candidates
    if not targets:
        raise ConfigError("model.lora", "the model has no Dense or EinsumDense layer to adapt")
    for layer in targets:
        if getattr(layer, "lora_enabled", False):
            raise ConfigError("model.lora", f"{layer.path} already has LoRA adapters")
        largest = adapter_rank_limit(tuple(layer.kernel.shape))
        if lora.rank > largest:
            shape = "x".join(str(d) for d in layer.kernel.shape)
            raise ConfigError(
                "model.lora.rank",
                f"is above the dimensions of {layer.path} (kernel {shape}: a rank of at most {largest})",
                lora.rank,
            )
    return targets


def adapter_rank_limit(kernel_shape: tuple[int, ...]) -> int:
    """The largest rank an adapter of a kernel of this shape can have: Keras' ``A`` maps every axis but the last to
    the rank, ``B`` the rank to the last axis."""
    return min(math.prod(kernel_shape[:-1]), kernel_shape[-1])


def _adaptable(model: keras.Model) -> Iterator[Any]:
    """Every Dense and EinsumDense layer of ``model``, nested models included, in the model's order."""
    import keras

    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            yield layer


def _matches(layer: Any, pattern: str) -> bool:
    """Whether ``pattern`` matches the layer's name or its path (``attention_0/query``)."""
    return fnmatchcase(layer.name, pattern) or fnmatchcase(layer.path, pattern)


def adapted_layers(model: keras.Model) -> list[Any]:
    """The layers of ``model`` that carry adapters, in the model's order."""
    return [layer for layer in _adaptable(model) if getattr(layer, "lora_enabled", False)]


def is_adapter(variable: Any) -> bool:
    """Whether ``variable`` is one of an adapter's two matrices."""
    return bool(variable.name in _ADAPTER_WEIGHTS)


def checkpointed_variables(model: keras.Model, *, adapted: bool) -> list[Any]:
    """The model's variables that a checkpoint holds: all of them, or for an ``adapted`` (LoRA) run the trainable
    ones (the adapters) and the state that is no weight (random generators'); the frozen weights never change, and
    the config rebuilds them."""
    if not adapted:
        return list(model.variables)
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if variable.trainable or id(variable) not in weights]


@dataclass(frozen=True)
class WeightCounts:
    """What a built model's weights hold: parameters (as ``count_params`` counts them, an int8 layer's scales
    included) and bytes."""

    trainable: int
    total: int
    bytes: int
    """The weights' bytes as the model holds them (an int8 kernel one byte a value, its scales included)."""
    unquantized_bytes: int
    """The same weights' bytes before quantization: an int8 weight in its layer's variable dtype, without scales."""

    @property
    def trainable_fraction(self) -> float:
        return self.trainable / self.total if self.total else 0.0


def weight_counts(model: keras.Model) -> WeightCounts:
    """The parameters and bytes of ``model``'s weights (see :class:`WeightCounts`)."""
    import keras

    trainable = total = held = unquantized = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):
        quantized = getattr(layer, "quantization_mode", None) is not None
        variable_dtype = layer.variable_dtype
        for variable in layer._trainable_variables + layer._non_trainable_variables:
            size = math.prod(variable.shape)
            itemsize = keras.backend.standardize_dtype(variable.dtype)
            total += size
            trainable += size if variable.trainable else 0
            held += size * _itemsize(itemsize)
            if not (quantized and variable.name in _QUANTIZATION_SCALES):
                unquantized += size * _itemsize(variable_dtype if quantized and itemsize == "int8" else itemsize)
    return WeightCounts(trainable, total, held, unquantized)


def _itemsize(dtype: str) -> int:
    import numpy as np

    return 2 if dtype == "bfloat16" else int(np.dtype(dtype).itemsize)


def describe_adaptation(section: ModelSection, model: keras.Model) -> list[str]:
    """The startup lines of a LoRA run: its adapters and trainable parameters, and with ``quantize`` the weights'
    bytes before and after."""
    lora = section.lora
    if lora is None:
        return []
    counts = weight_counts(model)
    adapted = adapted_layers(model)
    alpha = lora.alpha if lora.alpha is not None else lora.rank
    paths = _listed([layer.path for layer in adapted])
    lines = [
        f"lora rank {lora.rank}, alpha {alpha:g} on {len(adapted)} layers ({paths}): "
        f"{counts.trainable:,} trainable parameters of {counts.total:,} ({counts.trainable_fraction:.2%})"
    ]
    if section.quantize is not None:
        lines.append(f"quantize {section.quantize}: weights {_size(counts.unquantized_bytes)} -> {_size(counts.bytes)}")
    return lines


def _listed(paths: list[str], shown: int = 4) -> str:
    return ", ".join(paths) if len(paths) <= shown else f"{', '.join(paths[:shown])}, ... {len(paths) - shown} more"


def _size(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB" if count >= 2**20 else f"{count / 2**10:,.1f} KiB"
