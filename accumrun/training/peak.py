"""A run's peak memory as ``training.memory_budget`` counts it: on a GPU the device's peak (TensorFlow's allocator,
``tf.config.experimental.get_memory_info``), on a CPU the process's peak resident size (Linux's ``VmHWM``) above its
size when the meter starts, which a probe does right after TensorFlow's and Keras' imports."""

from __future__ import annotations

import contextlib
from pathlib import Path

import tensorflow as tf

_STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes."""
    for line in _STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"{_STATUS} has no {field}")


class PeakMeter:
    """Measures the peak from its creation on: the first GPU's, or the process's resident size above the start."""

    def __init__(self) -> None:
        gpus = tf.config.list_logical_devices("GPU")
        self.device = gpus[0].name.removeprefix("/device:") if gpus else None
        """``GPU:0`` where there is a GPU; None: the CPU, by resident size."""
        if self.device is not None:
            tf.config.experimental.reset_memory_stats(self.device)
            self._start = 0
        else:
            # Linux's peak is the process's since it began; "5" lowers it to the present size (Linux 4.0 on).
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")
            self._start = _status_bytes("VmRSS")

    def peak(self) -> int:
        """The peak bytes since the meter started."""
        if self.device is not None:
            return int(tf.config.experimental.get_memory_info(self.device)["peak"])
        return _status_bytes("VmHWM") - self._start
