"""Every file a run writes: the folder's layout, ``run.json``, ``metrics.jsonl``, the model and TensorBoard.

Whole files go through :func:`accumrun.rundir.atomic.write_atomically`; ``metrics.jsonl`` is appended and
flushed per row.
"""
