"""``optimizer.name: lbfgs``: full-batch L-BFGS (:mod:`accumrun.core.lbfgs`), its section, its build and what it
declares: the full batch, the same objective at the same weights, float32 or float64, and no schedule; the keys of
the Keras optimizers that mean nothing to it are refused, each saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from accumrun.kinds import LineSearch, Precision
from accumrun.lookup import normalized
from accumrun.optim.kind import OptimizerKind
from accumrun.sections import Section, words

if TYPE_CHECKING:
    import keras

# Keys of the Keras optimizers that mean nothing to L-BFGS, and why; each is refused in one line that says so.
_NOT_FOR_LBFGS = {
    "reduce_on_plateau": "L-BFGS's line search sets each step's length",
    "clipnorm": "a clipped gradient breaks the line search's Wolfe conditions",
    "global_clipnorm": "a clipped gradient breaks the line search's Wolfe conditions",
    "clipvalue": "a clipped gradient breaks the line search's Wolfe conditions",
    "weight_decay": "decay outside the objective breaks the line search; use the model's l2, part of the objective",
}


class LbfgsConfig(Section):
    """``name: lbfgs``: full-batch L-BFGS on the exact gradient (:mod:`accumrun.core.lbfgs`); ``batch_size: full``
    only. Stopping as ``torch.optim.LBFGS`` stops; ``training.epochs`` is the most iterations."""

    name: Literal["lbfgs"]
    learning_rate: float = Field(1.0, gt=0)
    """Scales the first trial step of each line search (as ``torch.optim.LBFGS``'s ``lr``); not a step size."""
    history: int = Field(10, ge=1)
    """How many curvature pairs approximate the inverse Hessian."""
    line_search: Annotated[LineSearch, words(LineSearch)] = LineSearch.STRONG_WOLFE
    tolerance_grad: float = Field(1e-7, ge=0)
    """Converged once the gradient's largest entry is at most this."""
    tolerance_change: float = Field(1e-9, ge=0)
    """Converged once the objective changes by less than this (where that is above the objective's resolution,
    ``|f| * 1.2e-7`` in float32, ``|f| * 2.2e-16`` in float64), or the step's largest entry is at most this."""
    max_evaluations: int | None = Field(None, ge=1)
    """The most full-batch evaluations over the whole run (None: no limit but ``training.epochs``)."""
    # The keys of _NOT_FOR_LBFGS, each a field that takes nothing, so that its refusal names the key and says why
    # (an unknown key would only list the known ones); reduce_on_plateau is also read wherever any optimizer is.
    reduce_on_plateau: None = Field(None, exclude=True)
    clipnorm: None = Field(None, exclude=True)
    global_clipnorm: None = Field(None, exclude=True)
    clipvalue: None = Field(None, exclude=True)
    weight_decay: None = Field(None, exclude=True)

    @field_validator("name", mode="before")
    @classmethod
    def _canonical_name(cls, value: Any) -> Any:
        # The union chose this section for any spelling of the name (LBFGS, l_bfgs); it is stored as lbfgs.
        return "lbfgs" if isinstance(value, str) and normalized(value) == "lbfgs" else value

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _no_schedule(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise ValueError("a schedule has no meaning for L-BFGS, whose line search sets each step's length")
        return value

    @field_validator(*_NOT_FOR_LBFGS, mode="before")
    @classmethod
    def _meaningless(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(f"has no meaning for L-BFGS: {_NOT_FOR_LBFGS[str(info.field_name)]}")
        return value

    @property
    def kind(self) -> OptimizerKind[LbfgsConfig]:
        """The registered kind, with what L-BFGS needs of the run."""
        return LBFGS

    @property
    def schedule(self) -> None:
        """None: the line search sets each step's length."""
        return None

    def describe(self, epochs: str, seed: int) -> str:
        """Its history, line search and limits, and that an epoch is one iteration."""
        evaluations = f", at most {self.max_evaluations:,} evaluations" if self.max_evaluations else ""
        return (
            f"optimizer lbfgs: {self.history} curvature pairs, {self.line_search} line search, first trial step "
            f"x{self.learning_rate:g}; one iteration per epoch, at most {epochs}{evaluations}; seed {seed}"
        )


def build_lbfgs(config: LbfgsConfig) -> keras.optimizers.Optimizer:
    """Build the L-BFGS optimizer, whose update keeps the gradient and whose ``iterate`` moves the weights."""
    from accumrun.core.lbfgs import Lbfgs

    return Lbfgs(
        history=config.history,
        tolerance_grad=config.tolerance_grad,
        tolerance_change=config.tolerance_change,
        max_evaluations=config.max_evaluations,
        learning_rate=config.learning_rate,
    )


LBFGS = OptimizerKind(
    "lbfgs",
    LbfgsConfig,
    build_lbfgs,
    full_batch=True,
    same_objective=True,
    iterates=True,
    precisions=(Precision.FLOAT32, Precision.FLOAT64),
    precision_reason="a mixed-precision objective is too coarse for its line search",
)
"""Full-batch L-BFGS: its line search needs the exact gradient of one fixed objective."""
