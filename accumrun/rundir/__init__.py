"""Every file a run writes, without TensorFlow: the folder's layout, ``run.json`` and ``metrics.jsonl`` as
types with their readers and writers, so that ``launch`` and the reports read a run folder without loading
TensorFlow.

Whole files go through :func:`accumrun.rundir.atomic.write_atomically`; ``metrics.jsonl`` is appended and
flushed per row. The model is saved by :mod:`accumrun.models.saving`, TensorBoard written by
:mod:`accumrun.training.tensorboard`.
"""
