"""What each measurement of ``training.measure`` declares of the config: the ``training`` keys it reads besides
``measure``, and whether it refuses replicas. The rules that follow are written here once, from the declarations:
a key no measurement asked for is refused, and so are replicas under a measurement made on one device. How each one
measures is :mod:`accumrun.training.measurements`' table. Nothing here imports TensorFlow."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accumrun.kinds import Measure


@dataclass(frozen=True)
class Declared:
    """What one measurement declares of the config."""

    keys: tuple[str, ...] = ()
    """The ``training`` keys it reads besides ``measure``; each is refused unless a measurement that reads it runs."""
    one_device: bool = False
    """It is measured on one device, so it refuses replicas."""


_PERIODIC = ("measure_every", "measure_samples")
"""The keys of a measurement made between updates, on a seeded set of training samples."""

DECLARED: dict[Measure, Declared] = {
    Measure.NOISE_SCALE: Declared(keys=("noise_scale_every",)),
    Measure.SHARPNESS: Declared(keys=_PERIODIC, one_device=True),
    Measure.HESSIAN_TRACE: Declared(keys=(*_PERIODIC, "trace_vectors"), one_device=True),
}


def measurement_rules(
    measure: Sequence[Measure], changed: Mapping[str, Any], strategy: str | None
) -> Iterator[tuple[str, str, Any]]:
    """The broken rules of the measurements ``measure``, as the key to blame, what is wrong and the value given: a
    key of ``changed`` (the ``training`` keys away from their defaults, with their values) that none of them reads,
    and, with a ``strategy`` of replicas (None for none), a measurement made on one device."""
    # Each key once, in the order the declarations name them, so that messages come in a fixed order.
    for key in dict.fromkeys(key for declared in DECLARED.values() for key in declared.keys):
        readers = [name for name, declared in DECLARED.items() if key in declared.keys]
        if key in changed and not set(readers) & set(measure):
            names = " and ".join(str(name) for name in readers)
            add = "it" if len(readers) == 1 else "one of them"
            yield f"training.{key}", f"applies to {names}; add {add} to training.measure", changed[key]
    if strategy is not None:
        yield from one_device_refusals(measure, f"not with distribute.strategy: {strategy}")


def one_device_refusals(measure: Sequence[Measure], where: str) -> Iterator[tuple[str, str, Any]]:
    """Each measurement of ``measure`` made on one device, refused ``where`` the run has replicas."""
    for name in measure:
        if DECLARED[name].one_device:
            yield "training.measure", f"{name} is measured on one device, {where}", str(name)
