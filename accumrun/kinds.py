"""The closed sets of accumrun, one enum each: what a config, a run folder or a command may say.

This module imports nothing of accumrun, TensorFlow or Keras, so every layer may use it: the config parses
into these, and everything after the config compares these, never their strings. Each member's value is the
word a YAML file, a CLI option or a run folder uses for it. ``auto``, where a key allows it, is not a member:
it is the config's way of saying "settle this", and setup settles it before anything else reads the key.
"""

from __future__ import annotations

from enum import Enum


class Kind(str, Enum):
    """A closed set whose members are the words users write (``str`` so that YAML and JSON carry them)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def words(cls) -> list[str]:
        """The members' words, in declaration order (for messages and CLI choices)."""
        return [member.value for member in cls]


class Task(Kind):
    """What the targets are, and so the default loss, metrics and output activation."""

    CLASSIFICATION = "classification"
    BINARY = "binary"
    REGRESSION = "regression"
    MULTI_LABEL = "multi_label"
    CAUSAL_LM = "causal_lm"

    @property
    def class_labels(self) -> bool:
        """Whether the targets are integer class indices: classification, binary (two classes, 0 and 1, with
        one output unit for the probability of class 1), and a language model's next tokens (one per position)."""
        return self in (Task.CLASSIFICATION, Task.BINARY, Task.CAUSAL_LM)

    @property
    def token_level(self) -> bool:
        """Whether the loss and metrics count real target tokens rather than samples (a language model's)."""
        return self is Task.CAUSAL_LM


class BatchNormMode(Kind):
    """What BatchNorm layers normalize with under accumulation, and when their moving statistics move."""

    PER_BATCH = "per_batch"
    SUB_BATCH = "sub_batch"
    PRECISE = "precise"
    FROZEN = "frozen"


class RandomDraws(Kind):
    """How the random layers (dropout, noise) draw inside the step: each sample's own draws, whatever the
    subdivisions, or one draw per sub-batch (how accumrun drew before per-sample draws, which subdivisions change)."""

    PER_SAMPLE = "per_sample"
    PER_SUB_BATCH = "per_sub_batch"


class Remat(Kind):
    """What the backward pass recomputes instead of keeping (``training.remat``): nothing, the activation functions
    (Keras' mode), each block's insides (only the blocks' boundaries are kept), or every layer with weights."""

    NONE = "none"
    ACTIVATIONS = "activations"
    BLOCKS = "blocks"
    LAYERS = "layers"


class Measure(Kind):
    """What a run measures of its batches beside training (``training.measure``); what each uses and refuses is
    declared in :mod:`accumrun.config.measures`, how it measures in :mod:`accumrun.training.measurements`."""

    NOISE_SCALE = "noise_scale"
    """The gradient noise scale: how large a batch still helps (:mod:`accumrun.core.noise`)."""
    SHARPNESS = "sharpness"
    """The top eigenvalue of the training loss's Hessian: what step is stable (:mod:`accumrun.core.hessian`)."""
    HESSIAN_TRACE = "hessian_trace"
    """The trace of the training loss's Hessian, by Hutchinson's estimate (:mod:`accumrun.core.hessian`)."""


class Feed(Kind):
    """How batches reach the step: whole, or streamed one sub-batch at a time."""

    BATCH = "batch"
    SUB_BATCH = "sub_batch"


class ModelFile(Kind):
    """Which of a finished run's saved models: the final one, or the one ``output.keep_best`` kept."""

    FINAL = "final"
    BEST = "best"

    @property
    def filename(self) -> str:
        """The file in the run folder: ``model.keras`` or ``model.best.keras``."""
        return "model.keras" if self is ModelFile.FINAL else "model.best.keras"


class Split(Kind):
    """Which data a finished run is evaluated on."""

    VAL = "val"
    TEST = "test"
    TRAIN = "train"


class Strategy(Kind):
    """Where the replicas of the step run (``auto`` in the config is settled to one of these)."""

    NONE = "none"
    MIRRORED = "mirrored"
    MULTI_WORKER = "multi_worker"


class Cluster(Kind):
    """Where a multi-worker cluster is described (``auto`` in the config is settled to one of these)."""

    TF_CONFIG = "tf_config"
    SLURM = "slurm"


class Precision(Kind):
    """The Keras dtype policy the model is built under."""

    FLOAT32 = "float32"
    MIXED_FLOAT16 = "mixed_float16"
    MIXED_BFLOAT16 = "mixed_bfloat16"


class LineSearch(Kind):
    """How L-BFGS finds each step's length."""

    STRONG_WOLFE = "strong_wolfe"


class OnNonFinite(Kind):
    """What a NaN or Inf in the loss or a gradient does."""

    STOP = "stop"
    SKIP_BATCH = "skip_batch"


class ColorMode(Kind):
    """How decoded images are kept: three channels or one."""

    RGB = "rgb"
    GRAYSCALE = "grayscale"


class CacheMode(Kind):
    """Where decoded images are kept for the next epochs and runs: nowhere, in memory, or in files on disk."""

    NONE = "none"
    MEMORY = "memory"
    DISK = "disk"


class Direction(Kind):
    """Whether a watched figure is better lower or higher (``auto`` in the config reads its name)."""

    MIN = "min"
    MAX = "max"


class RunState(Kind):
    """What ``run.json`` says of a run; ``completed`` is what makes a folder a finished run."""

    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
