"""The optimizers, registered once: for each kind, its section, its build and its declarations.

The config's ``optimizer`` union is built from this table (:mod:`accumrun.config.schema`), and
:func:`build_optimizer` builds from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accumrun.lookup import normalized
from accumrun.optim.keras_optimizer import KERAS_OPTIMIZER
from accumrun.optim.kind import OptimizerKind
from accumrun.optim.lbfgs import LBFGS
from accumrun.optim.section import OptimizerSection

if TYPE_CHECKING:
    import keras

OPTIMIZERS: dict[str, OptimizerKind[Any]] = {kind.name: kind for kind in (KERAS_OPTIMIZER, LBFGS)}
"""Every optimizer kind by its tag; a name that no other kind has is Keras'."""


def optimizer_tag(value: Any) -> str:
    """The kind an ``optimizer`` mapping (or section) is: the kind registered under its name, else Keras'."""
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    # Names are matched as Keras' are, without regard to case or underscores: LBFGS is lbfgs as ADAM is adam.
    tag = normalized(name) if isinstance(name, str) else None
    return tag if tag in OPTIMIZERS else KERAS_OPTIMIZER.name


def build_optimizer(config: OptimizerSection) -> keras.optimizers.Optimizer:
    """Build the configured optimizer through its kind.

    Raises:
        ConfigError: unknown optimizer or schedule, or a keyword it does not take, or a value it rejects.
    """
    return config.kind.build(config)
