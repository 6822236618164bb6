"""``accumrun generate``: text from a finished language model (``task: causal_lm``), one token at a time.

The prompt is tokenized as training tokenized the corpus, and the tokens written are decoded by the same
tokenizer. Each step runs the model on the last ``sequence_length`` tokens (the window it was trained on; a longer
text slides), reads the logits at the last real position, and picks the next token: the most likely (greedy, the
default) or, with ``temperature`` > 0, a draw from the softmax of the logits divided by it, from a generator
seeded by ``seed``, so the same call gives the same text. Padding is never picked.
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
    run_dir: Path,
    prompt: str,
    *,
    max_tokens: int = 200,
    temperature: float = 0.0,
    seed: int = 0,
    which: ModelFile = ModelFile.FINAL,
) -> Generated:
    """Continue ``prompt`` by ``max_tokens`` tokens with the run's language model (see the module's docstring).

    Raises:
        ConfigError: ``run_dir`` is not a finished run, not a language model, or has no such model; the prompt is
            empty or holds no token; ``max_tokens`` or ``temperature`` is negative.
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
    written: list[int] = []
    for _ in range(max_tokens):
        window = tokens[-length:]
        ids = np.zeros((1, length), np.int32)
        ids[0, : len(window)] = window
        logits = np.asarray(logits_of(tf.constant(ids))[0, len(window) - 1], np.float64)
        logits[PADDING_ID] = -np.inf
        token = _pick(logits, temperature, rng)
        tokens.append(token)
        written.append(token)
    return Generated(prompt, tokenizer.decode(written), len(written))


def _pick(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """The most likely token for ``temperature`` 0, else a draw from ``softmax(logits / temperature)``."""
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = (logits - logits.max()) / temperature
    probabilities = np.exp(scaled)
    return int(rng.choice(len(logits), p=probabilities / probabilities.sum()))
