"""Shared fixtures: tiny configs and datasets written by the tests, and a CLI runner in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def write_config(path: Path, **sections: Any) -> Path:
    """Write a YAML config with the given top-level sections."""
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def tiny_config(tmp_path: Path, **overrides: Any) -> Path:
    """A fast config: an MLP (no BatchNorm) on 23 synthetic samples, batch 10 split 3 ways (short last batch)."""
    sections: dict[str, Any] = {
        "seed": 3,
        "data": {"name": "synthetic", "samples": 26, "shape": [4], "classes": 3, "validation_split": 0.1},
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": 3},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
    }
    for key, value in overrides.items():
        sections[key] = {**sections.get(key, {}), **value} if isinstance(value, dict) else value
    return write_config(tmp_path / "tiny.yaml", **sections)


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run ``accumrun ARGS`` in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "accumrun", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
