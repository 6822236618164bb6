"""One batch in a fresh process, for ``subdivisions: auto``: ``python -m accumrun.training.probe CONFIG`` trains
the first batch once and exits 0 when it fits, 3 when TensorFlow runs out of memory, and 1 on any other failure.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from accumrun.config.schema import Config
from accumrun.errors import ConfigError

OUT_OF_MEMORY = 3


def fits_in_fresh_process(config: Config, subdivisions: int, timeout: float = 600) -> bool:
    """Whether the first batch of ``config`` trains with ``subdivisions`` in a new Python process."""
    with tempfile.TemporaryDirectory(prefix="accumrun-probe-") as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(config.with_subdivisions(subdivisions).to_yaml())
        result = subprocess.run(
            [sys.executable, "-m", "accumrun.training.probe", str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if result.returncode not in (0, OUT_OF_MEMORY):
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError("training.subdivisions", f"auto: the probe of {subdivisions} failed: {last_line}")
    return result.returncode == 0


def main(config_path: str) -> int:
    """Train the first batch of the config once; return the exit code."""
    import tensorflow as tf

    from accumrun.config.loading import load_config
    from accumrun.training.setup import build_training

    config = load_config(config_path)
    subdivisions = config.training.fixed_subdivisions
    if subdivisions is None:
        raise ConfigError("training.subdivisions", "the probe needs a number", config.training.subdivisions)
    setup = build_training(config)
    x, y = setup.fed.first_batch()
    try:
        setup.make_step(subdivisions).train_batch([(x, y)], int(x.shape[0]))
    except tf.errors.ResourceExhaustedError:
        return OUT_OF_MEMORY
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
