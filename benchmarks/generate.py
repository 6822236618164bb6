"""Benchmark ``generate``: tokens per second of the bundled char LM (``configs/char_lm.yaml``, a window of 64 bytes)
with the attention cache, without it, and as generation ran before the cache.

The variants, each greedy from the prompt ``MENENIUS:`` (9 tokens) to the end of the window (55 tokens):

- ``cached``: accumrun's generation, the built-in transformer's keys and values kept (``next_tokens``);
- ``uncached``: the same code with the cache off: the whole window runs for each token (what every token past the
  window costs, and what a model that is not the built-in transformer costs);
- ``before``: the loop as it was before the cache: one call of the whole window per token, the token picked on the
  host.

Each variant runs ``--repeats`` times in this process, each time from a fresh generator; the first token (which
traces) is timed apart, and tokens/s counts the other 54. The medians are reported. Run from the repository root;
it trains the example first unless ``--run-dir`` names a finished run of it (about 40 s on 2 cores), and writes
``docs/benchmarks-generate.md`` and the figures beside it:

    python benchmarks/generate.py [--run-dir RUN] [--repeats N] [--output PATH]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from run import machine, publish_report  # benchmarks/run.py, beside this script

PROMPT = "MENENIUS:"
TARGET = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="a finished run of configs/char_lm.yaml [default: train one]")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-generate.md"))
    args = parser.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run_dir or _trained(Path(scratch) / "char_lm")
        figures = measure(run_dir, args.repeats)
    cached, uncached, before = (figures[name]["tokens_per_second"] for name in ("cached", "uncached", "before"))
    rows = [
        f"| {name} | {figures[name]['tokens_per_second']:,.0f} | {figures[name]['tokens_per_second'] / uncached:.2f}x "
        f"| {figures[name]['first_token_seconds']:.2f} |"
        for name in ("cached", "uncached", "before")
    ]
    met = "met" if cached >= TARGET * uncached else "NOT met"
    body = [
        f"The bundled char LM (`configs/char_lm.yaml`, trained 10 epochs), greedy from `{PROMPT}` to the end of its",
        f"window of 64 bytes ({figures['tokens']} tokens after the first); the median of {args.repeats} runs.",
        "",
        "| variant | tokens/s | ÷ uncached | first token, s (tracing) |",
        "| --- | ---: | ---: | ---: |",
        *rows,
        "",
        f"The cache gives {cached / uncached:.1f}x the tokens/s of the same code without it (target {TARGET:.0f}x:",
        f"{met}), and {cached / before:.1f}x the loop before it. Past the window both run the whole window per token.",
    ]
    publish_report(
        args.output,
        title="Generation: tokens/s with and without the attention cache",
        command="python benchmarks/generate.py",
        info=info,
        figures=figures,
        body=body,
    )


def _trained(run_dir: Path) -> Path:
    """A finished run of the char LM example in ``run_dir``."""
    command = [sys.executable, "-m", "accumrun", "train", "configs/char_lm.yaml", "--run-dir", str(run_dir), "-q"]
    subprocess.run(command, check=True)
    return run_dir


def measure(run_dir: Path, repeats: int) -> dict[str, Any]:
    """Each variant's median tokens/s after the first token, and its first token's seconds."""
    from accumrun.kinds import ModelFile
    from accumrun.reports.finished import FinishedRun

    run = FinishedRun(run_dir)
    model = run.load_model(ModelFile.FINAL)
    text = run.text_input
    assert text is not None
    tokenizer, length = text
    prompt = [int(token) for token in tokenizer.ids(PROMPT)]
    count = length - len(prompt)
    variants: dict[str, Callable[[], Iterator[int]]] = {
        "cached": lambda: _next_tokens(model, length, prompt, cache=True),
        "uncached": lambda: _next_tokens(model, length, prompt, cache=False),
        "before": lambda: _before(model, length, prompt),
    }
    figures: dict[str, Any] = {"tokens": count - 1}
    made: dict[str, list[int]] = {}
    for name, start in variants.items():
        firsts, speeds = [], []
        for _ in range(repeats):
            began = time.perf_counter()
            tokens = start()
            first = next(tokens)
            traced = time.perf_counter()
            made[name] = [first, *itertools.islice(tokens, count - 1)]
            speeds.append((count - 1) / (time.perf_counter() - traced))
            firsts.append(traced - began)
        figures[name] = {
            "tokens_per_second": statistics.median(speeds),
            "first_token_seconds": statistics.median(firsts),
            "text": tokenizer.decode(made[name]),
        }
    if len({tuple(tokens) for tokens in made.values()}) != 1:
        raise SystemExit(f"the variants wrote different tokens: {made}")
    return figures


def _next_tokens(model: Any, length: int, prompt: list[int], *, cache: bool) -> Iterator[int]:
    from accumrun.reports.generate import next_tokens

    return next_tokens(model, length, prompt, temperature=0.0, seed=0, cache=cache)


def _before(model: Any, length: int, prompt: list[int]) -> Iterator[int]:
    """Greedy generation as accumrun did it before the cache: the whole window per token, picked on the host."""
    import numpy as np
    import tensorflow as tf

    logits_of = tf.function(lambda ids: model(ids, training=False), reduce_retracing=True)
    tokens = list(prompt)
    while True:
        window = tokens[-length:]
        ids = np.zeros((1, length), np.int32)
        ids[0, : len(window)] = window
        logits = np.asarray(logits_of(tf.constant(ids))[0, len(window) - 1], np.float64)
        logits[0] = -np.inf
        tokens.append(int(np.argmax(logits)))
        yield tokens[-1]


if __name__ == "__main__":
    main()
