"""``accumrun export``: a finished run's model as a TensorFlow SavedModel, for TF Serving or ``tf.saved_model.load``.

Its ``serving_default`` signature takes raw samples (the preprocessing is in the model), or for a run on text a
batch of strings (``texts``, tokenized inside by the run's tokenizer as TensorFlow ops, so serving needs no
accumrun). It is written with Keras' ``ExportArchive`` (what ``model.export`` uses) under a temporary name and
renamed into place, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from accumrun.errors import ConfigError
from accumrun.kinds import ModelFile, Task
from accumrun.reports.finished import FinishedRun
from accumrun.rundir.atomic import write_atomically


@dataclass(frozen=True)
class Exported:
    """Where the SavedModel is, and its serving signature."""

    path: Path
    samples: tf.TensorSpec
    """The signature's input: ``samples``, or ``texts`` (tf.string ``[None]``) for a run on text."""
    outputs: list[str]
    imports: tuple[str, ...] = ()
    """The modules that a process must import before it loads the SavedModel: those registering the ops of the
    tokenizer inside (TensorFlow itself has no such ops)."""

    def describe(self) -> str:
        """``wrote runs/x/export/savedmodel: serving_default(samples uint8 [None, 8, 8, 1]) -> probabilities, ...``,
        and for a tokenizer of tensorflow-text's ops `` (load it after `import tensorflow_text`)``."""
        shape = ", ".join("None" if size is None else str(size) for size in self.samples.shape)
        signature = f"{self.samples.name} {self.samples.dtype.name} [{shape}]"
        line = f"wrote {self.path}: serving_default({signature}) -> " + ", ".join(self.outputs)
        if self.imports:
            line += " (load it after " + " and ".join(f"`import {module}`" for module in self.imports) + ")"
        return line


def export_run(run_dir: Path, output: Path | None, *, overwrite: bool, which: ModelFile) -> Exported:
    """Write the run's model as a SavedModel to ``output`` (``RUN_DIR/export/savedmodel`` by default): see
    :func:`accumrun.export`."""
    run = FinishedRun(run_dir)
    run.refuse_language_model()
    target = output if output is not None else run_dir / "export" / "savedmodel"
    if target.exists() and not overwrite:
        raise ConfigError("output", "exists; pass --overwrite to replace it", str(target))
    model = run.load_model(which)
    to_probabilities = run.probabilities(model)
    labels = run.labels

    def serve(samples: tf.Tensor) -> dict[str, tf.Tensor]:
        outputs = to_probabilities(tf.cast(model(samples, training=False), tf.float32))
        if run.task is Task.REGRESSION:
            return {"values": outputs}
        if run.task is Task.MULTI_LABEL or labels is None:  # labels.json is there for every classification run
            return {"probabilities": outputs}
        if outputs.shape[-1] == 1:  # one sigmoid unit: the probability of the second of two classes
            outputs = tf.concat([1.0 - outputs, outputs], axis=-1)
        index = tf.argmax(outputs, axis=-1, output_type=tf.int32)
        return {"probabilities": outputs, "class_index": index, "class_name": tf.gather(tf.constant(labels), index)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    text = run.text_input
    imports: tuple[str, ...] = ()
    if text is None:
        spec = tf.TensorSpec((None, *model.input_shape[1:]), model.inputs[0].dtype, name="samples")
        archive.add_endpoint("serving_default", serve, input_signature=[spec])
    else:
        tokenizer, length = text
        imports = tokenizer.loader_imports
        spec = tf.TensorSpec((None,), tf.string, name="texts")
        archive.add_endpoint(
            "serving_default", lambda texts: serve(tokenizer.encode_tensor(texts, length)), input_signature=[spec]
        )
    if target.exists():  # --overwrite: the old export goes, the new one appears whole or not at all
        shutil.rmtree(target)
    write_atomically(target, lambda staging: archive.write_out(str(staging), verbose=False))
    outputs = {Task.REGRESSION: ["values"], Task.MULTI_LABEL: ["probabilities"]}.get(
        run.task, ["probabilities", "class_index", "class_name"]
    )
    return Exported(target, spec, outputs, imports)
