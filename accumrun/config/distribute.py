"""The ``distribute`` section (:mod:`accumrun.training.distribute` builds its strategy), and what distribution
refuses of the rest of the config."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import Field

from accumrun.kinds import Cluster, Feed, Strategy
from accumrun.sections import Problem, Section, words


class DistributeConfig(Section):
    """Where the replicas of the step run: one device (``none``), the local GPUs (``mirrored``), or several hosts
    (``multi_worker``). ``auto`` is ``mirrored`` with more than one GPU, else ``none``."""

    strategy: Annotated[Literal["auto"] | Strategy, words(Strategy, auto=True)] = Strategy.NONE
    logical_cpus: int | None = Field(None, ge=1)
    cluster: Annotated[Literal["auto"] | Cluster, words(Cluster, auto=True)] = "auto"
    """``multi_worker``: where the cluster is described: ``TF_CONFIG``, Slurm's variables, or whichever is set."""
    timeout_seconds: int = Field(300, ge=1)
    """``multi_worker``: how long a collective waits for a worker that stopped answering before the run ends."""

    def broken_rules(self, *, feed: Literal["auto"] | Feed) -> Iterator[Problem]:
        """Streamed sub-batches (``data.feed``) with replicas, and ``logical_cpus`` without ``mirrored``. A strategy of
        ``auto`` settles only once the devices are known; the feed refuses it then."""
        strategy = str(self.strategy)
        if feed == Feed.SUB_BATCH and self.strategy not in ("auto", Strategy.NONE):
            yield "data.feed", f"sub_batch streams on one device, not with distribute.strategy: {strategy}", "sub_batch"
        if self.logical_cpus is not None and self.strategy != Strategy.MIRRORED:
            message = f"splits the CPU into replicas for distribute.strategy: mirrored, not {strategy}"
            yield "distribute.logical_cpus", message, self.logical_cpus
