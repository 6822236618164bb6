"""The controls Keras users know from ``fit`` callbacks, decided from each epoch's row: early stopping, keeping
the best model, and lowering the learning rate on a plateau. Their state is a function of the rows alone, so a
resumed run rebuilds it by replaying the rows it keeps (:meth:`Controls.replay`); the learning rate itself lives
in the optimizer, which the checkpoints hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import keras

from accumrun.config.schema import Config, Watched
from accumrun.errors import ConfigError
from accumrun.rundir.metrics import EpochRow
from accumrun.training.hooks import EpochEnd, Hook


@dataclass
class Watch:
    """A monitored figure's best value so far and the epochs since it improved."""

    monitor: str
    minimize: bool
    min_delta: float = 0.0
    best: float | None = None
    since_best: int = 0

    def improves(self, value: float) -> bool:
        """Record ``value``; whether it beats the best so far by more than ``min_delta``."""
        best = self.best
        better = best is None or (value < best - self.min_delta if self.minimize else value > best + self.min_delta)
        if better:
            self.best, self.since_best = value, 0
        else:
            self.since_best += 1
        return better


@dataclass
class Decision:
    """What the controls decided after one epoch."""

    stop: str | None = None
    """Why training stops here."""
    keep_best: bool = False
    learning_rate: float | None = None
    """The rate to train the next epoch with, when it changes."""
    notes: list[str] = field(default_factory=list)


class Controls:
    """Early stopping, best-model keeping and reduce-on-plateau, as ``config`` asks for them."""

    def __init__(self, config: Config, logged: Iterable[str]) -> None:
        """Check that every monitored figure is one the rows log (``logged``), or raise ConfigError naming them."""
        names = sorted(logged)
        self._stopping = config.training.early_stopping
        self._plateau = config.optimizer.reduce_on_plateau
        self._best_config = config.output.best
        for key, watched in (
            ("training.early_stopping.monitor", self._stopping),
            ("optimizer.reduce_on_plateau.monitor", self._plateau),
            ("output.keep_best", self._best_config),
        ):
            if watched is not None and watched.monitor not in names:
                raise ConfigError(key, f"is not a logged figure; choose one of {', '.join(names)}", watched.monitor)
        stopping, plateau, best = self._stopping, self._plateau, self._best_config
        self._stop_watch = Watch(stopping.monitor, stopping.minimize, stopping.min_delta) if stopping else None
        self._plateau_watch = Watch(plateau.monitor, plateau.minimize, plateau.min_delta) if plateau else None
        self._best_watch = Watch(best.monitor, best.minimize) if best else None
        self._cooldown = 0

    @property
    def every_epoch(self) -> bool:
        """Whether a control decides at every epoch's end: one watches a training figure, not a validation one."""
        watched = (self._stopping, self._plateau, self._best_config)
        return any(w is not None and not w.monitor.startswith("val_") for w in watched)

    def headline(self, validated: bool) -> Watched:
        """The figure the summary reports the best of: ``keep_best``'s, early stopping's, ``val_loss`` or ``loss``."""
        for watched in (self._best_config, self._stopping):
            if watched is not None:
                return watched
        return Watched(monitor="val_loss" if validated else "loss")

    def replay(self, rows: list[EpochRow]) -> None:
        """Rebuild the state from the rows a resumed run keeps, as if they had just been decided."""
        for row in rows:
            self.after_epoch(row, row.learning_rate)

    def after_epoch(self, row: EpochRow, learning_rate: float) -> Decision:
        """Decide after the epoch that ``row`` logs, trained at ``learning_rate``. A control whose figure the row
        lacks (an epoch that did not validate) passes it by: patience counts the epochs it decides at."""
        decision = Decision()
        if self._best_watch is not None and self._best_watch.monitor in row.logged:
            decision.keep_best = self._best_watch.improves(row.figure(self._best_watch.monitor))
        if self._plateau is not None and self._plateau_watch is not None and self._plateau.monitor in row.logged:
            improved = self._plateau_watch.improves(row.figure(self._plateau.monitor))
            if self._cooldown > 0:
                self._cooldown -= 1
                self._plateau_watch.since_best = 0
            elif not improved and self._plateau_watch.since_best >= self._plateau.patience:
                lowered = max(learning_rate * self._plateau.factor, self._plateau.min_lr)
                if lowered < learning_rate:
                    decision.learning_rate = lowered
                    decision.notes.append(
                        f"{self._plateau.monitor} has not improved for {self._plateau.patience} epochs: learning rate "
                        f"{learning_rate:g} -> {lowered:g} from the next update"
                    )
                self._cooldown = self._plateau.cooldown
                self._plateau_watch.since_best = 0
        if self._stopping is not None and self._stop_watch is not None and self._stopping.monitor in row.logged:
            self._stop_watch.improves(row.figure(self._stopping.monitor))
            if self._stop_watch.since_best >= self._stopping.patience:
                decision.stop = (
                    f"early stopping: {self._stopping.monitor} has not improved for {self._stopping.patience} "
                    f"epochs (best {self._stop_watch.best:.6g})"
                )
        return decision


class Controlling(Hook):
    """The controls as a hook: stop as ``controls`` decide; once the row is written and shown, :attr:`acting` keeps
    the best model (``save_best``) and sets the learning rate, so a failed save never loses the row."""

    def __init__(
        self, controls: Controls, optimizer: keras.optimizers.Optimizer, save_best: Callable[[], object]
    ) -> None:
        self._controls = controls
        self._optimizer = optimizer
        self._save_best = save_best
        self._decided: Decision | None = None
        self.acting: Hook = _Acting(self)
        """The hook that carries out the decision: placed after the epoch log."""

    def on_epoch_end(self, end: EpochEnd) -> None:
        decision = self._controls.after_epoch(end.row, end.row.learning_rate)
        if decision.stop is not None:
            end.stop(decision.stop)
        end.notes.extend(decision.notes)
        self._decided = decision

    def act(self) -> None:
        """Keep the best model and set the learning rate, as the last epoch's decision says."""
        decision, self._decided = self._decided, None
        if decision is None:
            return
        if decision.keep_best:
            self._save_best()
        if decision.learning_rate is not None:
            self._optimizer.learning_rate = decision.learning_rate


class _Acting(Hook):
    def __init__(self, controlling: Controlling) -> None:
        self._controlling = controlling

    def on_epoch_end(self, end: EpochEnd) -> None:
        self._controlling.act()
