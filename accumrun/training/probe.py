"""One batch in a fresh process, for ``subdivisions: auto`` and ``accumrun plan``:
``python -m accumrun.training.probe CONFIG`` trains the first batch once and exits 0 when it fits, 3 when TensorFlow
runs out of memory, and 1 on any other failure; with ``--measure`` it trains it three times and prints, as its last
line, the peak memory (:mod:`accumrun.training.peak`) and the best time per sample of the last two, as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from accumrun.config.schema import Config
from accumrun.errors import ConfigError

OUT_OF_MEMORY = 3
_MEASURE = "--measure"


@dataclass(frozen=True)
class Measured:
    """One candidate's probe: its peak bytes and time per sample, or None for both where it ran out of memory."""

    subdivisions: int
    peak: int | None
    seconds_per_sample: float | None

    @property
    def out_of_memory(self) -> bool:
        """Whether the probe ran out of memory."""
        return self.peak is None


def _probe(config: Config, subdivisions: int, flags: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the probe on ``config`` with ``subdivisions``; ConfigError where it fails other than by memory."""
    with tempfile.TemporaryDirectory(prefix="accumrun-probe-") as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(config.with_subdivisions(subdivisions).to_yaml())
        result = subprocess.run(
            [sys.executable, "-m", "accumrun.training.probe", str(path), *flags],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if result.returncode not in (0, OUT_OF_MEMORY):
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError("training.subdivisions", f"auto: the probe of {subdivisions} failed: {last_line}")
    return result


def fits_in_fresh_process(config: Config, subdivisions: int, timeout: float = 600) -> bool:
    """Whether the first batch of ``config`` trains with ``subdivisions`` in a new Python process."""
    return _probe(config, subdivisions, [], timeout).returncode == 0


def measure_in_fresh_process(config: Config, subdivisions: int, timeout: float = 600) -> Measured:
    """The peak memory and time per sample of the first batch of ``config`` with ``subdivisions``, in a new process."""
    result = _probe(config, subdivisions, [_MEASURE], timeout)
    if result.returncode == OUT_OF_MEMORY:
        return Measured(subdivisions, None, None)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    return Measured(subdivisions, int(measured["peak"]), float(measured["seconds_per_sample"]))


def main(config_path: str, measure: bool = False) -> int:
    """Train the first batch of the config (three times to ``measure``); return the exit code."""
    import time

    import keras  # noqa: F401  (imported before the meter starts: the libraries' size is not the run's)
    import tensorflow as tf

    from accumrun.config.loading import load_config
    from accumrun.training.peak import PeakMeter
    from accumrun.training.setup import build_training

    meter = PeakMeter()
    config = load_config(config_path)
    subdivisions = config.training.fixed_subdivisions
    if subdivisions is None:
        raise ConfigError("training.subdivisions", "the probe needs a number", config.training.subdivisions)
    setup = build_training(config)
    x, y = setup.fed.first_batch()
    samples = int(x.shape[0])
    step = setup.make_step(subdivisions)
    times = []
    try:
        for _ in range(3 if measure else 1):
            started = time.perf_counter()
            float(step.train_batch([(x, y)], samples).loss_sum)  # the value waits for the batch to finish
            times.append(time.perf_counter() - started)
    except tf.errors.ResourceExhaustedError:
        return OUT_OF_MEMORY
    if measure:
        # The first call traces and compiles the step; the others time it.
        print(json.dumps({"peak": meter.peak(), "seconds_per_sample": min(times[1:]) / samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], measure=_MEASURE in sys.argv[2:]))
