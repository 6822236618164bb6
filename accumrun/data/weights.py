"""``data.weight`` as the sources read it: one weight per sample, checked.

It ends as the split's ``w`` (see :mod:`accumrun.data.splits`), which travels with the targets to the step. It
weights every split that has it, so the validation loss is weighted as Keras weights ``validation_data=(x, y,
sample_weight)``; ``training.class_weight`` is :mod:`accumrun.data.class_weights`' job.
"""

from __future__ import annotations

import numpy as np

from accumrun.errors import DataError


def checked_weights(w: np.ndarray, where: str, samples: int) -> np.ndarray:
    """``w`` as float32, one weight per sample; ``where`` says where it was read (for the message).

    Raises:
        DataError: ``w`` is not one real number per sample, or holds a negative, NaN or Inf weight.
    """
    if w.ndim == 2 and w.shape[1] == 1:
        w = w[:, 0]
    if w.ndim != 1 or len(w) != samples:
        raise DataError("data.weight", f"{where}: needs one weight per sample ({samples:,})", w.shape)
    if not (np.issubdtype(w.dtype, np.integer) or np.issubdtype(w.dtype, np.floating)):
        raise DataError("data.weight", f"{where}: weights must be real numbers", str(w.dtype))
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        raise DataError("data.weight", f"{where}: weights must be finite and >= 0", float(w[bad][0]))
    return w.astype(np.float32)
