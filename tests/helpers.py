"""Helpers shared by the tests: configs and data files written into tmp_path, small models, the CLI in this
process or in a subprocess, and comparisons of weights."""

from __future__ import annotations

import gzip
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from accumrun.data.arrays import IDX_FILES
from accumrun.training.runner import RunResult

FEATURES, CLASSES = 5, 3


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


@dataclass(frozen=True)
class CliResult:
    """What one command left: its exit code and its two output streams, named as ``subprocess.run`` names them."""

    returncode: int
    stdout: str
    stderr: str


def invoke(*args: str) -> CliResult:
    """Run ``accumrun ARGS`` in this process, in the current directory (tests move with ``monkeypatch.chdir``).

    Click's runner keeps stdout and stderr apart (click 8.2+). An exception that the command line lets through
    fails the test with its traceback, where a user would have seen one. A user's module imported from the
    working directory puts that folder on ``sys.path``; it is taken off again, so no test sees another's files.
    """
    from click.testing import CliRunner

    from accumrun.cli import main

    path = list(sys.path)
    try:
        result = CliRunner().invoke(main, list(args), prog_name="accumrun", catch_exceptions=False)
    finally:
        sys.path[:] = path
    return CliResult(result.exit_code, result.stdout, result.stderr)


def run_cli(
    *args: str, cwd: Path | None = None, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``accumrun ARGS`` in a fresh interpreter, as a user would: for what only a process shows (its whole
    stderr, signals, ``launch``); ``env`` adds to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "accumrun", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
    )


REPO = Path(__file__).resolve().parent.parent
"""The checkout under test: the working directory and import path of the processes that tests start."""


def child_import_path() -> str:
    """``PYTHONPATH`` for a process that imports this checkout (:data:`REPO`), with what tests/conftest.py put on it
    for every process a test starts."""
    return os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])


def start_paused(arguments: list[str], cwd: Path, **popen: Any) -> subprocess.Popen[str]:
    """``python ARGUMENTS`` in ``cwd``, its output piped, importing this checkout (and its tests.hook_models, whose
    forward passes pause 0.1 s each there, so that a run is still training when a test signals it)."""
    return subprocess.Popen(
        [sys.executable, *arguments],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": child_import_path(),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "ACCUMRUN_TEST_PAUSE_AT_FORWARD": "0.1",
        },
        **popen,
    )


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 00 00 08 <rank>, big-endian uint32 dims, then the data."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray) -> Path:
    raw = idx_bytes(array)
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


def write_idx_folder(folder: Path, compressed: bool = True) -> dict[str, np.ndarray]:
    """The four standard IDX files of a tiny MNIST-like set (6 training, 4 test images of 3x2 pixels)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "x_train": np.arange(6 * 3 * 2, dtype=np.uint8).reshape(6, 3, 2) * 7,
        "y_train": np.array([0, 1, 2, 9, 4, 5], dtype=np.uint8),
        "x_test": np.full((4, 3, 2), 255, dtype=np.uint8),
        "y_test": np.array([3, 3, 7, 1], dtype=np.uint8),
    }
    arrays["x_train"][5, 2, 1] = 255  # instead of 245
    for key, filename in IDX_FILES.items():
        name = filename if compressed else filename.removesuffix(".gz")
        write_idx(folder / name, arrays[key])
    return arrays


def dense_model(seed: int = 0, regularized: bool = False) -> Any:
    """A BatchNorm-free float32 model, so subdivisions must not change its trajectory."""
    import keras  # here, so that the tests without TensorFlow do not import it

    keras.utils.set_random_seed(seed)
    regularizer = keras.regularizers.L2(0.05) if regularized else None
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(7, activation="tanh", kernel_regularizer=regularizer),
            keras.layers.Dense(CLASSES),
        ]
    )


def make_data(samples: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype(np.float32)
    y = rng.integers(CLASSES, size=samples).astype(np.int32)
    return x, y


def max_difference(a: list[Any], b: list[Any]) -> float:
    """The largest absolute difference between two lists of arrays (or variables), element by element."""
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b, strict=True))


def assert_close(a: list[np.ndarray], b: list[np.ndarray], atol: float = 1e-6) -> None:
    """Two lists of arrays (weights, most often) agree element by element to ``atol``, with no relative slack."""
    assert len(a) == len(b)
    for left, right in zip(a, b, strict=True):
        np.testing.assert_allclose(left, right, atol=atol, rtol=0)


def signal_after_batch(
    monkeypatch: pytest.MonkeyPatch,
    batch: int,
    signals: Sequence[int] = (signal.SIGINT,),
    *,
    one_update_per_call: bool = True,
) -> None:
    """Send ``signals`` to this process right after the call that trains the run's ``batch``-th batch (1-based,
    over the whole run), from the main thread, as a user's Ctrl-C during that call is handled. With
    ``one_update_per_call`` every call runs one update, so the stop lands after exactly that batch, whole or
    streamed; else where the call ends."""
    # Imports TensorFlow, so only for the tests that stop a run.
    from accumrun.training.batches import DeviceBatches, FedBatches
    from accumrun.training.cadence import Cadence

    if one_update_per_call:
        monkeypatch.setattr(Cadence, "wanted", lambda self, seconds_per_update: 1)
    batches = 0

    def counted(run: Any) -> Any:
        def wrapper(self: Any, *args: Any) -> Any:
            nonlocal batches
            updates = run(self, *args)
            before, batches = batches, batches + len(updates.applied)
            if before < batch <= batches:
                for number in signals:
                    os.kill(os.getpid(), number)
            return updates

        return wrapper

    for kind in (DeviceBatches, FedBatches):
        monkeypatch.setattr(kind, "run", counted(kind.run))


Trained = Callable[[str, dict[str, Any]], RunResult]
"""The ``trained`` fixture (tests/conftest.py): ``trained(name, config)`` is the run of ``config``, trained once per
module under ``name``."""


# --- the noise scale's references (tests/test_measure.py and tests/test_distribute.py) --------------------------------


def reference_estimates(gradients: np.ndarray, sub_batches: list[np.ndarray]) -> tuple[float, float]:
    """``(|G|^2, tr(S))`` of one batch from its per-sample ``gradients`` (one row each) and the rows of each of its
    sub-batches, by the formulas of the issue (float64)."""
    rows = np.concatenate(sub_batches)
    units = len(rows)
    batch = gradients[rows].mean(axis=0)
    weighted = sum(len(part) * np.sum(gradients[part].mean(axis=0) ** 2) for part in sub_batches)
    trace = (weighted - units * np.sum(batch**2)) / (len(sub_batches) - 1)
    return float(np.sum(batch**2) - trace / units), float(trace)


def contiguous(sizes: list[int], start: int = 0) -> list[np.ndarray]:
    """The rows of consecutive sub-batches of ``sizes`` from row ``start``."""
    bounds = np.cumsum([start, *sizes])
    return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def softmax_gradients(kernel: np.ndarray, bias: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each sample's gradient of its cross-entropy under a linear softmax model, kernel then bias."""
    logits = x.astype(np.float64) @ kernel + bias
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    residual = probabilities - np.eye(kernel.shape[1])[y]
    return np.concatenate([(x[:, :, None] * residual[:, None, :]).reshape(len(x), -1), residual], axis=1)
