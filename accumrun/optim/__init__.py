"""Optimizers and learning-rate schedules, each kind registered once with its config section, its build and what it
declares of the run (:mod:`.kind`); code outside reads a section through :class:`.section.OptimizerSection`.

The kinds: any Keras optimizer by name (:mod:`.keras_optimizer`) and full-batch L-BFGS (:mod:`.lbfgs`), in the table
:data:`.optimizers.OPTIMIZERS`; any Keras schedule by name (:mod:`.schedules`). The rules a kind's declarations make
for the rest of a run are written once, in :mod:`.rules`. Nothing here imports TensorFlow until a build runs, so the
config can be checked without it.
"""

from accumrun.optim.optimizers import build_optimizer
from accumrun.optim.schedules import build_schedule

__all__ = ["build_optimizer", "build_schedule"]
