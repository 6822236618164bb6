"""pytest configuration: TensorFlow's C++ logging quieted for every test and subprocess, and shared fixtures.

Helpers that tests import (configs, data files, the CLI in a subprocess) are in tests/helpers.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
