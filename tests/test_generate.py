"""``generate``: the cached decoding gives the uncached one's tokens, the text comes as it is made (whole characters
only), and Ctrl-C keeps it. Speed is measured by benchmarks/generate.py, not here."""

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import keras
import numpy as np
import pytest
import tensorflow as tf

from accumrun import load_config, train
from accumrun.data.tokenizers.byte import ByteTokenizer
from accumrun.models.transformer import KeyValueCache, Transformer, transformer
from accumrun.reports.generate import next_tokens
from accumrun.reports.kv_cache import cached_transformer
from accumrun.reports.text_stream import TextStream
from tests.test_lm import lm_config

WINDOW = 64
PROMPT = [40, 73, 102, 33, 12]


def tokens(model: keras.Model, count: int, *, cache: bool, temperature: float = 0.0) -> list[int]:
    made = next_tokens(model, WINDOW, PROMPT, temperature=temperature, seed=7, cache=cache)
    return list(itertools.islice(made, count))


@pytest.mark.slow
def test_the_cache_gives_the_uncached_tokens_within_the_window_and_past_it() -> None:
    keras.utils.set_random_seed(3)
    model = transformer((WINDOW,), 257, 257, layers=2, heads=2, width=16, dropout=0.0, causal=True)
    assert cached_transformer(model) is not None
    # After 5 tokens, the first 59 fill the window of 64 from the cache; the last 21 slide past it, uncached.
    greedy = tokens(model, 80, cache=True)
    uncached = tokens(model, 80, cache=False)
    assert greedy[:48] == uncached[:48]
    assert greedy == uncached
    assert len(set(greedy)) > 1
    # A draw depends on the seed and the token's place alone, so the cached loop draws as the uncached steps do.
    drawn = tokens(model, 80, cache=True, temperature=1.0)
    assert drawn == tokens(model, 80, cache=False, temperature=1.0) != greedy


@pytest.mark.slow
def test_a_saved_transformer_loaded_by_keras_decodes_through_its_own_layers_as_the_whole_model_computes(
    tmp_path: Path,
) -> None:
    keras.utils.set_random_seed(5)
    model = transformer((WINDOW,), 257, 257, layers=2, heads=2, width=16, dropout=0.1, causal=True, attention_bias=True)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    found = Transformer.of(loaded)
    assert found is not None
    # The loaded model's own layers, each in its place (the names are the test's check, not how they are found).
    assert [block.attention for block in found.blocks] == [loaded.get_layer(f"attention_{i}") for i in range(2)]
    assert [found.token_embedding.name, found.position_embedding.name] == ["token_embedding", "position_embedding"]
    assert [found.blocks[1].feed_forward.name, found.head.name] == ["feed_forward_1", "head"]
    # One position at a time over the cache: the whole model's logits at each position.
    ids = np.array([[*PROMPT, 9, 200, 31, 1, 77] + [0] * (WINDOW - 10)], np.int32)
    whole = np.asarray(loaded(ids))[0]
    cache = KeyValueCache(found)
    for position in range(10):
        logits = found.call_with_cache(tf.constant(ids[0, position]), tf.constant(position), cache)
        np.testing.assert_allclose(np.asarray(logits), whole[position], rtol=1e-5, atol=1e-5)
    assert tokens(loaded, 20, cache=True) == tokens(model, 20, cache=False)
    # A classifier pools its positions: it is no language model, and generates uncached.
    assert Transformer.of(transformer((WINDOW,), 2, 257, layers=1, heads=2, width=16, dropout=0.0)) is None


@pytest.mark.slow
def test_a_keras_hub_backbone_generates_with_keras_hubs_cache_the_uncached_tokens() -> None:
    pytest.importorskip("keras_hub")
    from accumrun.models.hub import keras_hub_model
    from accumrun.reports.hub_cache import cached_hub_model

    keras.utils.set_random_seed(3)
    hub = {"name": "keras_hub.models.GPT2Backbone", "num_layers": 1, "num_heads": 2, "hidden_dim": 16}
    config = load_config({"data": {"name": "text_corpus", "path": "x"}, "model": {**hub, "intermediate_dim": 32}})
    model = keras_hub_model(config.model, (WINDOW,), 257, 257, per_position=True, any_length=False)
    assert cached_hub_model(model, WINDOW) is not None
    greedy = tokens(model, 70, cache=True)
    assert greedy == tokens(model, 70, cache=False)
    assert len(set(greedy)) > 1


def test_a_model_that_is_not_the_built_in_transformer_generates_uncached() -> None:
    ids = keras.Input((WINDOW,), dtype="int32")
    hidden = keras.layers.LSTM(8, return_sequences=True)(keras.layers.Embedding(257, 8)(ids))
    model = keras.Model(ids, keras.layers.Dense(257)(hidden))
    assert cached_transformer(model) is None
    assert len(tokens(model, 3, cache=True)) == 3


def pieces(ids: Sequence[int]) -> list[str]:
    """What a stream of the byte tokenizer gives for each of ``ids``, then at the end."""
    stream = TextStream(ByteTokenizer().decode)
    return [stream.add(int(token)) for token in ids] + [stream.finish()]


def test_text_comes_out_as_each_character_is_complete() -> None:
    text = "naïve 🙂\r\n\tcafe\u0301!"
    given = pieces(list(ByteTokenizer().ids(text)))
    assert "".join(given) == text
    assert "\ufffd" not in "".join(given)
    # One piece per character, given by the token of its last byte; the bytes before it give nothing.
    assert [piece for piece in given if piece] == list(text)
    assert given[:4] == ["n", "a", "", "ï"]


def test_a_tokenizer_whose_pieces_read_differently_in_context_streams_its_whole_text() -> None:
    # SentencePiece-like: a word's piece starts with a space, dropped at the start of a text.
    words = ["", "Hello", " world", ",", " again"]

    def decode(ids: Sequence[int]) -> str:
        return "".join(words[i] for i in ids).lstrip(" ")

    stream = TextStream(decode)
    given = [stream.add(token) for token in (1, 2, 3, 4)] + [stream.finish()]
    assert given == ["Hello", " world", ",", " again", ""]


def test_an_incomplete_character_at_the_end_is_given_as_a_lenient_reader_shows_it() -> None:
    cut = list(ByteTokenizer().ids("ok 🙂"))[:-1]
    assert pieces(cut) == ["o", "k", " ", "", "", "", "\ufffd"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("generate")
    train(lm_config(folder), folder / "run", quiet=True)
    return folder / "run"


@pytest.mark.slow
@pytest.mark.subprocess
def test_generate_prints_tokens_as_they_come_and_ctrl_c_keeps_them_with_exit_130(lm_run: Path) -> None:
    # A billion tokens: by design, it runs until Ctrl-C.
    command = [
        sys.executable,
        "-m",
        "accumrun",
        "generate",
        str(lm_run),
        "--prompt",
        "The ",
        "--max-tokens",
        str(10**9),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert process.stdout is not None
    shown = read_more_than(process.stdout, len(b"The "), seconds=60)
    assert process.poll() is None  # the text is there while the process still runs
    assert shown.startswith(b"The ") and len(shown) > len(b"The ")
    process.send_signal(signal.SIGINT)
    rest, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr.decode()
    assert (shown + rest).decode().startswith("The ")  # whole characters only, the text seen before kept
    assert stderr.decode().strip().endswith("stopped by Ctrl-C"), stderr.decode()
    assert b"Aborted" not in stderr and b"Traceback" not in stderr


def read_more_than(stream: IO[bytes], size: int, *, seconds: float) -> bytes:
    """What ``stream`` gives until it has given more than ``size`` bytes, it ends, or ``seconds`` pass."""
    given = b""
    deadline = time.monotonic() + seconds
    while len(given) <= size and select.select([stream], [], [], max(deadline - time.monotonic(), 0))[0]:
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:  # the process ended
            break
        given += chunk
    return given
