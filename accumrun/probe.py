"""One batch in a fresh process: does this many subdivisions fit in memory? Used by ``subdivisions: auto``.

``python -m accumrun.probe CONFIG`` builds the run CONFIG describes, trains its first batch once with
``training.subdivisions`` and exits 0 when it fits, 3 when TensorFlow runs out of memory, and 1 on any other
failure.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from accumrun.config import Config
from accumrun.errors import ConfigError

OUT_OF_MEMORY = 3


def fits_in_fresh_process(config: Config, subdivisions: int, timeout: float = 600) -> bool:
    """Whether the first batch of ``config`` trains with ``subdivisions`` in a new Python process."""
    training = config.training.model_copy(update={"subdivisions": subdivisions})
    with tempfile.TemporaryDirectory(prefix="accumrun-probe-") as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(config.model_copy(update={"training": training}).to_yaml())
        result = subprocess.run(
            [sys.executable, "-m", "accumrun.probe", str(path)],
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

    from accumrun.config import load_config
    from accumrun.run import build_training, first_batch

    config = load_config(config_path)
    setup = build_training(config)
    x, y = first_batch(config, setup.dataset, setup.batch_size)
    try:
        setup.make_step(config.training.subdivisions)(x, y)
    except tf.errors.ResourceExhaustedError:
        return OUT_OF_MEMORY
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
