"""Validation at the end of each epoch: the mean loss and every metric over the validation samples."""

from __future__ import annotations

from accumrun.training.setup import TrainingSetup


class Validation:
    """Scores the model on the validation data in batches no larger than a training sub-batch, so validation
    never needs more memory than training."""

    def __init__(self, setup: TrainingSetup, batch_size: int) -> None:
        self._size = setup.dataset.val_size
        self._feeder = setup.val_feeder(batch_size)
        self._metrics = setup.val_metrics
        self._step = setup.make_eval_step()

    def __call__(self) -> dict[str, float]:
        """``val_loss`` and ``val_<metric>`` for each metric under the current weights, in inference mode."""
        self._metrics.reset()
        loss_sum = 0.0
        for x, y in self._feeder.epoch(0):
            loss_sum += float(self._step(x, y))
        results = {f"val_{name}": value for name, value in self._metrics.results().items()}
        return {"val_loss": loss_sum / self._size, **results}
