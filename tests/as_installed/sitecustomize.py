"""Run first by every Python process that a test starts (``tests/conftest.py`` puts this folder on their
``PYTHONPATH``): the process then has what a user's install of accumrun has, without scikit-learn, which ``.[dev]``
adds only as a test reference.

Keras imports scikit-learn whenever it can (``keras.wrappers``, through ``import tensorflow``), which costs each such
process 1.3 s of CPU here that a user's install does not pay. A ``None`` in ``sys.modules`` makes ``import sklearn``
raise ImportError, as where it is not installed, so an import of it by accumrun itself fails these tests as it would
fail a user.
"""

import sys

sys.modules["sklearn"] = None  # type: ignore[assignment]
