"""``accumrun generate``: text from a finished language model (``task: causal_lm``), one token at a time.

Each step runs the model on the last ``sequence_length`` tokens (the window it was trained on; a longer text
slides), reads the logits at the last real position, and picks the next token (see :func:`accumrun.generate`).
Padding is never picked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from accumrun.core.tokens import PADDING_ID
from accumrun.errors import ConfigError
from accumrun.kinds import ModelFile, Task
from accumrun.reports.finished import FinishedRun


@dataclass(frozen=True)
class Generated:
    """A prompt and the text the model wrote after it."""

    prompt: str
    continuation: str
    tokens: int
    """How many tokens the model wrote."""

    @property
    def text(self) -> str:
        return self.prompt + self.continuation


def generate_text(
    run_dir: Path, prompt: str, *, max_tokens: int, temperature: float, seed: int, which: ModelFile
) -> Generated:
    """Continue ``prompt`` by ``max_tokens`` tokens with the run's language model: :func:`accumrun.generate`.

    Raises:
        ConfigError: also when the prompt holds no token, or the run has no tokenizer to read and write text with.
    """
    run = FinishedRun(run_dir)
    if run.task is not Task.CAUSAL_LM:
        raise ConfigError(
            "RUN_DIR",
            f"generate continues text with a language model (task causal_lm); this run's "
            f"task is {run.task.value}: use accumrun predict",
            str(run_dir),
        )
    if not prompt:
        raise ConfigError("prompt", "give the model some text to continue")
    for key, value in (("max_tokens", max_tokens), ("temperature", temperature)):
        if value < 0:
            raise ConfigError(key, "must be >= 0", value)
    text = run.text_input
    if text is None:  # a token file's run decodes only with data.tokenizer
        raise ConfigError(
            "data.tokenizer",
            f"generate reads the prompt and writes text with the run's tokenizer; this run's data.name: "
            f"{run.config.data.name} has none (set data.tokenizer to the one that made its ids)",
            str(run_dir),
        )
    # The training windows' length, from the config: a model of bucketed padding takes any length.
    tokenizer, length = text
    model = run.load_model(which)
    # One shape, one trace: every step runs a window of `length` tokens, padded after the real ones.
    logits_of = tf.function(lambda ids: model(ids, training=False), reduce_retracing=True)
    rng = np.random.default_rng(seed)
    tokens = [int(token) for token in tokenizer.ids(prompt)]
    if not tokens:  # whitespace alone under word_piece: no position to read the next token's logits from
        raise ConfigError("prompt", "holds no token under the run's tokenizer", prompt)
    start = len(tokens)
    for _ in range(max_tokens):
        window = tokens[-length:]
        ids = np.zeros((1, length), np.int32)
        ids[0, : len(window)] = window
        logits = np.asarray(logits_of(tf.constant(ids))[0, len(window) - 1], np.float64)
        logits[PADDING_ID] = -np.inf
        tokens.append(_pick(logits, temperature, rng))
    return Generated(prompt, tokenizer.decode(tokens[start:]), max_tokens)


def _pick(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """The most likely token for ``temperature`` 0, else a draw from ``softmax(logits / temperature)``."""
    if temperature == 0:
        return int(np.argmax(logits))
    probabilities = np.exp((logits - logits.max()) / temperature)
    return int(rng.choice(len(logits), p=probabilities / probabilities.sum()))
