"""``accumrun generate``: text from a finished language model (``task: causal_lm``), one token at a time, each
piece of text given as soon as it is complete.

The next token is read from the logits at the last real position of the text's last ``sequence_length`` tokens
(the window it was trained on; a longer text slides), the most likely one or a draw (see :func:`accumrun.generate`).
Padding is never picked. The built-in transformer keeps its attention's keys and values within the window
(:mod:`accumrun.reports.kv_cache`), and a KerasHub backbone KerasHub's cache (:mod:`accumrun.reports.hub_cache`), so
a token costs one position's work there; past the window, and for any other model, each token runs the whole
window.
"""

from __future__ import annotations

import io
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from accumrun.errors import ArgumentError, ConfigError
from accumrun.kinds import ModelFile, Task
from accumrun.reports.finished import FinishedRun
from accumrun.reports.hub_cache import cached_hub_model
from accumrun.reports.kv_cache import CachedDecoding, cached_transformer
from accumrun.reports.picking import pick
from accumrun.reports.text_stream import TextStream


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
    max_tokens: int,
    temperature: float,
    seed: int,
    which: ModelFile,
    on_text: Callable[[str], None] | None = None,
) -> Generated:
    """Continue ``prompt`` by ``max_tokens`` tokens with the run's language model: :func:`accumrun.generate`.
    ``on_text`` is given the prompt, once the model is ready, then each piece of text as it is complete.

    Raises:
        ArgumentError: the prompt is empty, or ``max_tokens`` or ``temperature`` is negative.
        ConfigError: also when the prompt holds no token, or the run has no tokenizer to read and write text with.
    """
    # Wrong whatever the run, so found before the run is read: bad arguments (a usage error on the command line).
    if not prompt:
        raise ArgumentError("prompt", "give the model some text to continue")
    for key, value in (("max_tokens", max_tokens), ("temperature", temperature)):
        if value < 0:
            raise ArgumentError(key, "must be >= 0", value)
    run = FinishedRun(run_dir)
    if run.task is not Task.CAUSAL_LM:
        raise ConfigError(
            "RUN_DIR",
            f"generate continues text with a language model (task causal_lm); this run's "
            f"task is {run.task.value}: use accumrun predict",
            str(run_dir),
        )
    text = run.text_input
    if text is None:  # a token file's run decodes only with data.tokenizer
        raise ConfigError(
            "data.tokenizer",
            f"generate reads the prompt and writes text with the run's tokenizer; this run's data.name: "
            f"{run.config.data.name} has none (set data.tokenizer to the one that made its ids)",
        )
    # The training windows' length, from the config: a model of bucketed padding takes any length.
    tokenizer, length = text
    prompt_ids = [int(token) for token in tokenizer.ids(prompt)]
    if not prompt_ids:  # whitespace alone under word_piece: no position to read the next token's logits from
        raise ConfigError("prompt", "holds no token under the run's tokenizer", prompt)
    tokens = next_tokens(run.load_model(which), length, prompt_ids, temperature=temperature, seed=seed)
    show = on_text or (lambda piece: None)
    show(prompt)
    stream, continuation = TextStream(tokenizer.decode), io.StringIO()
    for _, token in zip(range(max_tokens), tokens, strict=False):
        piece = stream.add(token)
        if piece:
            show(piece)
            continuation.write(piece)
    piece = stream.finish()
    if piece:
        show(piece)
        continuation.write(piece)
    return Generated(prompt, continuation.getvalue(), max_tokens)


_SECONDS_PER_CALL = 0.05
"""How long a cached call may run before its tokens are given: short enough that the text flows, long enough that
each call's dispatch costs little."""


def next_tokens(
    model: keras.Model, length: int, prompt_ids: list[int], *, temperature: float, seed: int, cache: bool = True
) -> Iterator[int]:
    """The tokens ``model`` writes after ``prompt_ids``, without end, over windows of ``length`` tokens: from the
    cached decoding while the text fits the window (with ``cache``, for the built-in transformer and KerasHub's
    causal backbones), then from the whole window, sliding. Only the window is kept, so a long generation takes no
    more memory than a short one."""
    window: deque[int] = deque(prompt_ids[-length:], maxlen=length)
    cached: CachedDecoding | None = None
    if cache and len(prompt_ids) < length:
        cached = cached_transformer(model) or cached_hub_model(model, length)
    made = 0
    if cached is not None:
        for token in _cached_tokens(cached, window, temperature, seed):
            made += 1
            yield token
    logits_of = _whole_window(model, length, temperature)
    # A draw depends on the token's place in the text, so the cached tokens and these draw alike.
    for index in itertools.count(len(prompt_ids) + made):
        ids = np.zeros((1, length), np.int32)
        ids[0, : len(window)] = window
        token = int(logits_of(tf.constant(ids), len(window), seed, index))
        window.append(token)
        yield token


def _cached_tokens(cached: CachedDecoding, window: deque[int], temperature: float, seed: int) -> Iterator[int]:
    """The tokens after ``window`` (the prompt) up to a full window, several per call: as many as take about
    :data:`_SECONDS_PER_CALL`, so that the text still comes as it is made."""
    length = cached.length
    ids = np.zeros(length, np.int32)
    ids[: len(window)] = window
    fed, known, count = 0, len(window), 1
    while known < length:
        count = min(count, length - known)
        start = time.perf_counter()
        ids = cached.extend(ids, fed, known, count, temperature, seed)
        seconds = time.perf_counter() - start
        for token in ids[known : known + count]:
            window.append(int(token))
            yield int(token)
        # The first call (fed 0) traces the loop, so its seconds say nothing of the next call's: the count just grows.
        paced = int(_SECONDS_PER_CALL * count / max(seconds, 1e-6)) if fed else 8 * count
        fed, known = known + count - 1, known + count
        count = max(1, min(8 * count, paced))


def _whole_window(model: keras.Model, length: int, temperature: float) -> Callable[..., tf.Tensor]:
    """The next token after the first ``real`` of a window of ``length`` ids, from the whole model."""

    def next_token(ids: tf.Tensor, real: tf.Tensor, seed: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        return pick(model(ids, training=False)[0, real - 1], temperature, seed, index)

    # One shape, one trace: every step runs a window of `length` tokens, padded after the real ones.
    window, real, number = (
        tf.TensorSpec([1, length], tf.int32),
        tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.int64),
    )
    return tf.function(next_token, input_signature=[window, real, number, number])
