"""Saving the trained model: ``model.keras`` and ``model.best.keras``, compiled so that Keras alone reproduces
the run's figures.

``keras.models.load_model("run/model.keras").evaluate(x, y)`` must give the run's validation loss and metrics
with no accumrun code, so the compiled loss and metrics are Keras' own classes. Two things differ from the step:

- The model outputs what it trained to output (usually logits), while accumrun's metrics see probabilities.
  Metrics that read only the order of the outputs (accuracy, top-k) are the same on logits. A threshold on a
  sigmoid's probability is a threshold on the logit (``BinaryAccuracy``), and ``AUC`` takes ``from_logits``.
- The targets are what the user passes: class indices, or one-hot rows when the run's loss takes them that
  way (``categorical_crossentropy`` on a multi-class output).

A language model's loss is the mean over real tokens: Keras' sparse cross-entropy gets ``ignore_class=0``, the
padding id, which gives that mean. Its metrics are left out (Keras would count the padding).

A metric that cannot be computed from what Keras sees is left out, and named, so that nobody mistakes a
different number for the run's; ``accumrun evaluate`` always gives every metric.

An int8 model multiplies in Keras' int32 there, where accumrun multiplies the same integers in float32
(:mod:`accumrun.models.int8_matmul`): the outputs are the same to the bit up to an inner dimension of 1,040, and
within float32's rounding of the sums beyond it.

The archive is written from disk, not memory (:func:`write_keras_archive`): Keras' ``model.save`` builds the
weights file in memory when the machine has room, and then copies it, which at the end of a run that barely fits
costs twice the weights and the optimizer's slots.
"""

from __future__ import annotations

import contextlib
import functools
import math
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import keras
import tensorflow as tf

from accumrun.core.losses import Objective
from accumrun.core.tokens import PADDING_ID
from accumrun.models.adapters import adapters_path, save_adapters
from accumrun.rundir.atomic import write_atomically

_ORDER_ONLY = (
    keras.metrics.SparseCategoricalAccuracy,
    keras.metrics.CategoricalAccuracy,
    keras.metrics.SparseTopKCategoricalAccuracy,
    keras.metrics.TopKCategoricalAccuracy,
)


@dataclass(frozen=True)
class CompileSpec:
    """What ``model.compile`` gets: the loss and the metrics (None when the loss is the user's own function,
    which Keras could not load without their code), and the metrics left out."""

    loss: keras.losses.Loss | None
    metrics: list[keras.metrics.Metric] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str | None:
        """A line for the console when the compiled model differs from the run in what it measures."""
        if self.loss is None:
            return "model.keras is saved uncompiled: its loss is a custom function; accumrun evaluate scores it"
        if not self.left_out:
            return None
        why = "; ".join(f"{name} ({reason})" for name, reason in self.left_out.items())
        return f"model.keras is compiled without {why}; accumrun evaluate gives every metric"


def compile_spec(objective: Objective) -> CompileSpec:
    """The Keras loss and metrics that give the run's figures on the saved model's output."""
    # The step's loss, reduced to the batch mean as Keras reports it: the same class and keywords.
    step_loss = objective.loss
    if not isinstance(step_loss, keras.losses.Loss):
        return CompileSpec(loss=None)
    settings = {**step_loss.get_config(), "reduction": "sum_over_batch_size"}
    if objective.token_level:
        if "ignore_class" not in settings:
            return CompileSpec(loss=None)
        settings["ignore_class"] = PADDING_ID
    loss = type(step_loss).from_config(settings)
    if objective.token_level:
        return CompileSpec(loss, left_out={spec.name: "Keras would count the padding" for spec in objective.metrics})
    one_hot = objective.class_labels and not objective.sparse_loss and objective.outputs > 1
    metrics: list[keras.metrics.Metric] = []
    left_out: dict[str, str] = {}
    for spec in objective.metrics:
        metric = spec.make()
        takes_indices = spec.sparse or not objective.class_labels or objective.outputs == 1
        if objective.class_labels and takes_indices == one_hot:
            left_out[spec.name] = "it needs class indices" if one_hot else "it needs one-hot targets"
            continue
        on_outputs = _on_outputs(metric, objective)
        if on_outputs is None:
            left_out[spec.name] = "it needs probabilities and the model outputs logits"
            continue
        metrics.append(on_outputs)
    return CompileSpec(loss, metrics, left_out)


def save_trained_model(
    model: keras.Model,
    path: Path,
    *,
    objective: Objective,
    optimizer: keras.optimizers.Optimizer,
    strategy: tf.distribute.Strategy | None = None,
) -> CompileSpec:
    """Save ``model`` to ``path`` (a ``.keras`` file, atomically), compiled with :func:`compile_spec`'s loss and
    metrics and a Keras optimizer: the run's (its state included, so that ``fit`` can go on), or for one that Keras
    alone could not load (L-BFGS), Keras' default (RMSprop); under ``strategy``'s scope when the optimizer's variables
    live on its replicas."""
    spec = compile_spec(objective)
    if type(optimizer).__module__.partition(".")[0] != "keras":
        # model.keras names the optimizer's module, and Keras alone loads only its own.
        optimizer = keras.optimizers.RMSprop()
    if spec.loss is not None:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model.compile(optimizer=optimizer, loss=spec.loss, metrics=spec.metrics)
    write_atomically(path, functools.partial(write_keras_archive, model))
    # A LoRA run's adapters alone, beside it: a small file that a config starts from (model.adapters).
    save_adapters(model, adapters_path(path))
    return spec


def write_keras_archive(model: keras.Model, path: Path) -> None:
    """Write ``model`` to the local ``.keras`` file ``path`` as ``model.save(path)`` does, through the disk.

    Keras saves a folder one variable at a time (``zipped=False``); the archive is that folder's files, stored as
    Keras stores them, which ``keras.models.load_model`` reads as its own. The folder, beside ``path``, is removed
    once the archive is written or the saving fails; a process killed outright leaves it behind, as it leaves
    :func:`accumrun.rundir.atomic.write_atomically`'s temporary file. Until then the model is on disk twice.
    """
    # Absolute: Keras writes the assets of a folder given by a relative path into a temporary folder, and drops them.
    folder = path.absolute().with_name(f"{path.name}.folder")
    try:
        model.save(folder, zipped=False)
        with zipfile.ZipFile(path, "w") as archive:
            for file in sorted(folder.rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(folder).as_posix())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _on_outputs(metric: keras.metrics.Metric, objective: Objective) -> keras.metrics.Metric | None:
    """``metric`` as it must be built to see the model's raw outputs; None when no Keras setting makes it so."""
    activation = objective.to_probabilities
    # Softmax and sigmoid keep the order of the outputs, so accuracy and top-k read logits alike.
    if activation is tf.identity or isinstance(metric, _ORDER_ONLY):
        return metric
    if activation is not tf.sigmoid:
        return None
    config = metric.get_config()
    if isinstance(metric, keras.metrics.BinaryAccuracy):
        threshold = config["threshold"]
        config["threshold"] = math.log(threshold / (1 - threshold)) if 0 < threshold < 1 else threshold
        return type(metric).from_config(config)
    if isinstance(metric, keras.metrics.AUC):
        return type(metric).from_config({**config, "from_logits": True})
    return None
