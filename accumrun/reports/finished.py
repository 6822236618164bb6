"""A finished run, as ``evaluate``, ``predict``, ``export`` and ``generate`` read it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import keras
import tensorflow as tf

from accumrun.config.loading import load_config
from accumrun.config.schema import Config
from accumrun.data.tokenizers import Tokenizer, text_input
from accumrun.data.vocabulary import settle_vocabulary
from accumrun.errors import ConfigError
from accumrun.kinds import ModelFile, RunState, Task
from accumrun.models.lora import wrap_int8_calls
from accumrun.models.outputs import output_activation
from accumrun.objective import probability_function
from accumrun.rundir.layout import require_run_folder
from accumrun.rundir.metrics import load_metrics
from accumrun.rundir.status import read_status


class FinishedRun:
    """A run folder whose ``run.json`` says completed (else an ArgumentError or ConfigError); its ``config`` carries
    a learned vocabulary's tokens, read from the folder, for every tokenizer and dataset built from it."""

    def __init__(self, run_dir: Path) -> None:
        status = read_status(require_run_folder(run_dir))
        if status != RunState.COMPLETED:
            state = status.value if status is not None else "nothing readable"
            raise ConfigError(str(run_dir), f"not a finished run (its run.json says {state})")
        self.run_dir = run_dir
        config = load_config(run_dir / "config.yaml")
        # A learned vocabulary is the run's saved one, whatever the data has become since.
        self.config: Config = config.model_copy(update={"data": settle_vocabulary(config.data, config.seed, run_dir)})

    @property
    def task(self) -> Task:
        """The task the run settled on (its ``config.yaml`` records it, never ``auto``)."""
        return Task(self.config.data.task)

    def refuse_language_model(self) -> None:
        """Raise a ConfigError for a language model's run: predict and export take samples; it continues text."""
        if self.task is Task.CAUSAL_LM:
            message = "is a language model (task causal_lm): continue text with accumrun generate"
            raise ConfigError("RUN_DIR", message, str(self.run_dir))

    def model_path(self, which: ModelFile) -> Path:
        """``model.keras`` or ``model.best.keras``; a ConfigError when the run has no such model."""
        path = self.run_dir / which.filename
        if not path.is_file():
            hint = "; set output.keep_best to keep one" if which is ModelFile.BEST else ""
            raise ConfigError("model", f"the run has no {path.name}{hint}", which.value)
        return path

    def load_model(self, which: ModelFile) -> keras.Model:
        """The saved model, uncompiled: accumrun scores it with the run's own objective. Its int8 layers, if any,
        multiply in float32, as in training (:func:`accumrun.models.lora.wrap_int8_calls`)."""
        model = keras.models.load_model(self.model_path(which), compile=False)
        wrap_int8_calls(model)
        return model

    @property
    def labels(self) -> list[str] | None:
        """The output names of ``labels.json`` (classification and multi-label); None for regression."""
        return self._json_list("labels.json")

    @property
    def features(self) -> list[str] | None:
        """The feature columns of a CSV run (``features.json``, or for a run from before it the training file's
        header); None for other sources."""
        recorded = self._json_list("features.json")
        return recorded if recorded is not None else self.config.data.header_features()

    @property
    def text_input(self) -> tuple[Tokenizer, int] | None:
        """The tokenizer and sequence length of a run on text; None for other runs."""
        return text_input(self.config.data)

    @property
    def sub_batch_size(self) -> int:
        """The run's training sub-batch: scoring and predicting in batches of it needs no more memory than training."""
        return max(int(load_metrics(self.run_dir)[-1]["sub_batch_size"]), 1)

    def probabilities(self, model: keras.Model) -> Callable[[tf.Tensor], tf.Tensor]:
        """What turns ``model``'s outputs into probabilities (or leaves regression values as they are)."""
        width = int(model.output_shape[-1])
        return probability_function(self.task, width, self.config.loss.from_logits, output_activation(model))

    def _json_list(self, name: str) -> list[str] | None:
        path = self.run_dir / name
        return [str(item) for item in json.loads(path.read_text())] if path.is_file() else None
