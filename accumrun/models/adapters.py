"""The adapters of a LoRA run in a file of their own: ``adapters.weights.h5`` beside ``model.keras``, and
``model.adapters: FILE`` to start a run from them.

The file holds each adapted layer's two matrices in the model's order (with its path, for the messages), their rank
and alpha, and a fingerprint of the base they were trained on: a SHA-256 of the adapted layers' frozen weights, as
held (int8 where the base was quantized). Adapters from another base are refused, whatever their shapes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py  # type: ignore[import-untyped]
import numpy as np

from accumrun.errors import ConfigError
from accumrun.models.lora import adapted_layers, is_adapter
from accumrun.rundir.atomic import write_atomically

if TYPE_CHECKING:
    import keras


def adapters_path(model_path: Path) -> Path:
    """Where the adapters of the model saved at ``model_path`` go: ``model.keras`` -> ``adapters.weights.h5``,
    ``model.best.keras`` -> ``adapters.best.weights.h5``."""
    middle = model_path.name.removeprefix("model").removesuffix(".keras")
    return model_path.with_name(f"adapters{middle}.weights.h5")


def save_adapters(model: keras.Model, path: Path) -> bool:
    """Write ``model``'s adapters to ``path`` (atomically); False, and nothing written, where it has none."""
    layers = adapted_layers(model)
    if not layers:
        return False

    def write(temporary: Path) -> None:
        with h5py.File(temporary, "w") as file:
            file.attrs["base_sha256"] = base_fingerprint(layers)
            file.attrs["rank"] = layers[0].lora_rank
            file.attrs["alpha"] = layers[0].lora_alpha
            for index, layer in enumerate(layers):
                group = file.create_group(str(index))
                group.attrs["path"] = layer.path
                group["a"] = np.asarray(layer.lora_kernel_a.numpy())
                group["b"] = np.asarray(layer.lora_kernel_b.numpy())

    write_atomically(path, write)
    return True


def load_adapters(model: keras.Model, path: str) -> None:
    """Set ``model``'s adapters to those saved in ``path``.

    Raises:
        ConfigError: the file is missing or unreadable, holds adapters of other layers or shapes, or was saved from
            another base.
    """
    layers = adapted_layers(model)
    if not Path(path).is_file():
        raise ConfigError("model.adapters", "file not found", path)
    try:
        with h5py.File(path, "r") as file:
            base = str(file.attrs["base_sha256"])
            saved = [
                (str(file[str(i)].attrs["path"]), file[f"{i}/a"][()], file[f"{i}/b"][()]) for i in range(len(file))
            ]
    except (OSError, KeyError) as error:
        raise ConfigError("model.adapters", f"cannot read as adapters: {error}", path) from None
    shapes = [(tuple(layer.lora_kernel_a.shape), tuple(layer.lora_kernel_b.shape)) for layer in layers]
    configured = [(layer.path, a) for layer, (a, _) in zip(layers, shapes, strict=True)]
    if [(a.shape, b.shape) for _, a, b in saved] != shapes:
        raise ConfigError(
            "model.adapters",
            f"holds adapters for {len(saved)} layers ({_shapes([(p, a.shape) for p, a, _ in saved])}); "
            f"model.lora adapts {len(layers)} ({_shapes(configured)})",
            path,
        )
    if base != base_fingerprint(layers):
        raise ConfigError(
            "model.adapters",
            "was saved from another base: the weights of the layers it adapts differ (the model, its seed and "
            "model.quantize must be those of the run that saved it)",
            path,
        )
    for layer, (_, a, b) in zip(layers, saved, strict=True):
        layer.lora_kernel_a.assign(a)
        layer.lora_kernel_b.assign(b)


def base_fingerprint(layers: list[Any]) -> str:
    """A SHA-256 of the frozen weights (shape, dtype and values) of the adapted ``layers``."""
    digest = hashlib.sha256()
    for layer in layers:
        for variable in layer.weights:
            if is_adapter(variable):
                continue
            value = np.ascontiguousarray(variable.numpy())
            digest.update(f"{value.shape}{value.dtype}".encode())
            digest.update(value.tobytes())
    return digest.hexdigest()


def _shapes(layers: list[tuple[str, tuple[int, ...]]]) -> str:
    """``attention_0/query 8x2x4, ...``: each layer with the shape of its first matrix, the first four."""
    shown = [f"{path} {'x'.join(str(d) for d in shape)}" for path, shape in layers[:4]]
    return ", ".join(shown + ([f"... {len(layers) - 4} more"] if len(layers) > 4 else []))
