"""Why the built-in transformer has no attention biases by default: S=3 against S=1, with Adam and with SGD, with the
biases and without, printed as the largest weight difference in the attention's key bias and in every other weight::

    python benchmarks/attention_bias.py

The model and data are the tests' small language model: a 1-layer byte-level transformer of width 16 over 5
generated files, windows of 24 tokens, batches of 10, 2 epochs. The key bias's true gradient is exactly 0 (softmax
ignores a shift of a query's scores), so what moves it is float noise, which Adam turns into steps.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from accumrun import train
from accumrun.data.examples import write_corpus

OPTIMIZERS = ({"name": "adam", "learning_rate": 0.01}, {"name": "sgd", "learning_rate": 0.3})


def config(corpus: Path, optimizer: dict[str, Any], bias: bool, subdivisions: int) -> dict[str, Any]:
    return {
        "seed": 1,
        "data": {"name": "text_corpus", "path": str(corpus), "sequence_length": 24, "validation_split": 0.1},
        "model": {"name": "transformer", "layers": 1, "heads": 2, "width": 16, "attention_bias": bias},
        "training": {"epochs": 2, "batch_size": 10, "subdivisions": subdivisions},
        "optimizer": optimizer,
        "output": {"tensorboard": False},
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        corpus = write_corpus(folder / "corpus", 5, seed=4)
        for optimizer in OPTIMIZERS:
            for bias in (True, False):
                one, three = (
                    train(config(corpus, optimizer, bias, s), folder / f"{optimizer['name']}-{bias}-{s}", quiet=True)
                    for s in (1, 3)
                )
                key, other = 0.0, 0.0
                for a, b in zip(one.model.weights, three.model.weights, strict=True):
                    difference = float(np.max(np.abs(a.numpy() - b.numpy())))
                    if "key" in a.path and "bias" in a.path:
                        key = max(key, difference)
                    else:
                        other = max(other, difference)
                print(
                    f"{optimizer['name']} attention_bias={str(bias).lower()}: key bias {key:.2g}, "
                    f"every other weight {other:.2g}"
                )


if __name__ == "__main__":
    main()
