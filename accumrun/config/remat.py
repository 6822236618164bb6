"""``training.remat``: its rules, and how ``auto`` settles.

Remat never changes a number (random draws are per sample and seeded, and a recomputation replays them), so it is
free to choose: ``auto`` chooses it with ``subdivisions: auto`` under a memory budget. Without one, ``auto`` is
``none``; :func:`settle_remat` is the one place where it settles.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from accumrun.kinds import Remat
from accumrun.models.registry import kind_of
from accumrun.sections import Problem


def remat_rules(remat: Remat | Literal["auto"], model: Any) -> Iterator[Problem]:
    """``blocks`` on a kind of model that declares none (an MLP, the darknet CNN)."""
    if remat is Remat.BLOCKS and kind_of(model).blocks is None:
        yield "training.remat", f"blocks: a {model.name} model has no blocks to recompute; use layers", "blocks"


def settle_remat(remat: Remat | Literal["auto"]) -> Remat:
    """``remat`` with ``auto`` settled: ``none``, since without a memory budget nothing asks for less memory."""
    return Remat.NONE if remat == "auto" else remat
