"""The ``sentence_piece`` tokenizer: learned from the training texts, it gives every text back byte for byte (spaces,
tabs, line breaks, indentation, ``\\r\\n``, emoji, combining marks), encodes alike on the host and as TensorFlow ops,
and a language model trained with it writes line breaks. An export of a run on text says what its loader must
import, and a loader that does without it fails as the line says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import accumrun
from accumrun.config.schema import data_config
from accumrun.data.examples import write_text_folder
from accumrun.data.tokenizers import Tokenizer, tokenizer_for
from accumrun.data.tokenizers.sentence_piece import SentencePieceTokenizerConfig
from accumrun.data.vocabulary import settle_vocabulary
from accumrun.errors import ConfigError

CODE = (
    "def parse(path, *, strict=False):\n"
    '    """Yield the lines of a file."""\n'
    "    with open(path) as file:\n"
    "        for line in file:\n"
    "            if strict and not line:\n"
    "                raise ValueError(path)\n"
    "            yield line.rstrip()\n"
    "\n"
)
PROSE = "The river runs past the mill.\r\nIts water is cold,  and clear.\r\n\r\nNobody swims there.\r\n"

ROUND_TRIPS = [
    pytest.param(CODE, id="code-indented-with-spaces"),
    pytest.param("if x:\n\tif y:\n\t\treturn {'a': [1, 2]}\n\telse:\t# a tab inside\n\t\tpass\n", id="code-tabs"),
    pytest.param(PROSE, id="prose-crlf-and-double-spaces"),
    pytest.param("Bravo 👍🏽, the family 👨‍👩‍👧 flew 🇫🇷 to 東京.\n", id="emoji-and-cjk"),
    pytest.param("cafe\u0301 and café, n\u0303, a\u0308\u0304, e\u0328\u0301", id="combining-marks"),
    pytest.param("  \t leading and trailing \t  \n\n\n", id="whitespace-at-the-edges"),
    pytest.param("no\xa0break, wide\u3000space, line\u2028separator, BOM\ufeff, NUL\x00", id="unusual-whitespace"),
    pytest.param("\u2581 is SentencePiece's own mark for a space, ▁▁ twice", id="sentence-piece-space-mark"),
    pytest.param("", id="empty"),
]


def learned(folder: Path) -> SentencePieceTokenizerConfig:
    """The ``sentence_piece`` section learned from a corpus of ``CODE`` and ``PROSE`` (a few times each)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "code.txt").write_text(CODE * 6, encoding="utf-8", newline="")
    (folder / "prose.txt").write_text(PROSE * 6, encoding="utf-8", newline="")
    section = {"name": "sentence_piece", "vocabulary_size": 400}
    data = data_config(name="text_corpus", path=str(folder), tokenizer=section, sequence_length=16)
    settled = settle_vocabulary(data, 0, None).tokenizer
    assert isinstance(settled, SentencePieceTokenizerConfig) and settled.model is not None
    return settled


@pytest.fixture(scope="module")
def section(tmp_path_factory: pytest.TempPathFactory) -> SentencePieceTokenizerConfig:
    return learned(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenizer(section: SentencePieceTokenizerConfig) -> Tokenizer:
    return tokenizer_for(section)


@pytest.mark.parametrize("text", ROUND_TRIPS)
def test_decoding_gives_the_text_back_byte_for_byte(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.ids(text)
    assert tokenizer.decode(ids).encode("utf-8") == text.encode("utf-8")
    # The input pipeline and an export encode as the host does, padded with 0.
    graph = tokenizer.encode_tensor(tf.constant([text]), len(ids) + 2).numpy()[0]
    assert graph.tolist() == [*ids.tolist(), 0, 0]
    # No piece spans a line break: a text's ids are its lines' ids, one after another (how a corpus is read).
    lines = [line + "\n" for line in text.split("\n")[:-1]] + [text.split("\n")[-1]]
    assert np.concatenate([tokenizer.ids(line) for line in lines]).tolist() == ids.tolist()


def test_the_learned_model_pads_with_0_spells_bytes_and_learns_indentation(
    section: SentencePieceTokenizerConfig, tokenizer: Tokenizer, tmp_path: Path
) -> None:
    assert section.model is not None
    pieces = spm.SentencePieceProcessor(model_proto=section.model)
    assert [pieces.id_to_piece(i) for i in (0, 1, 2, 3, 258)] == ["<pad>", "<unk>", "\n", "<0x00>", "<0xFF>"]
    assert tokenizer.vocabulary_size == pieces.get_piece_size() <= 400
    vocabulary = {pieces.id_to_piece(i) for i in range(pieces.get_piece_size())}
    assert {"    ", "        "} <= vocabulary  # indentation: one piece, not one id per space
    assert len(tokenizer.ids(CODE)) < len(CODE) / 2
    # A character outside the vocabulary is its UTF-8 bytes, never unknown; bytes cut mid-character (a generation
    # stopped there) decode as U+FFFD, one per byte, not as an error.
    assert tokenizer.ids("🦘").tolist() == [3 + byte for byte in "🦘".encode()]
    assert tokenizer.decode(tokenizer.ids("🦘")[:2]) == "\ufffd\ufffd"
    # The same texts learn the same model.
    assert learned(tmp_path).model == section.model


def test_the_host_and_the_graph_give_the_same_ids_line_for_line(tmp_path: Path) -> None:
    # The two are separate SentencePiece builds (the sentencepiece package; tensorflow-text's op): every id a run
    # trains on (host) must be the id that predict and an export compute (graph).
    root = Path(__file__).resolve().parent.parent
    play = root / "datasets" / "coriolanus.txt"
    data = data_config(
        name="text_corpus", path=str(play), tokenizer={"name": "sentence_piece", "vocabulary_size": 1000}
    )
    tokenizer = tokenizer_for(settle_vocabulary(data, 0, None).tokenizer)
    lines = [
        *play.read_text(encoding="utf-8").split("\n"),
        *(root / "README.md").read_text(encoding="utf-8").split("\n"),
    ]
    # A token covers at least one byte (unknown characters fall back to theirs), and a line may begin with the word
    # boundary as a token of its own: two more than the longest line's bytes leave the last position padding.
    length = max(len(line.encode("utf-8")) for line in lines) + 2
    host = tokenizer.encode(lines, length)
    assert (host[:, -1] == 0).all()  # no line is cut
    np.testing.assert_array_equal(tokenizer.encode_tensor(tf.constant(lines), length).numpy(), host)


def causal_convolution(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """A small language model that traces in a fraction of the built-in transformer's time: each position's next
    token from the 4 tokens up to it."""
    ids = keras.Input(input_shape, dtype="int32")
    x = keras.layers.Embedding(classes, 32)(ids)
    x = keras.layers.Conv1D(64, 4, padding="causal", activation="relu")(x)
    return keras.Model(ids, keras.layers.Dense(classes)(x))


@pytest.mark.slow
def test_a_language_model_trained_with_it_writes_line_breaks_and_indentation(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "code.txt").write_text(CODE * 20, encoding="utf-8")
    config = {
        "seed": 1,
        "data": {
            "name": "text_corpus",
            "path": str(corpus),
            "sequence_length": 32,
            "validation_split": 0,
            "tokenizer": {"name": "sentence_piece", "vocabulary_size": 320},
            # The token file tokenizes in pieces of whole lines: right, since no piece spans a line break.
            "cache": "disk",
            "cache_dir": str(tmp_path / "cache"),
        },
        "model": {"name": "tests.test_sentence_piece:causal_convolution"},
        # The step is traced once; the epochs after the first take 0.1 s each, and by the 30th the code is learned.
        "training": {"epochs": 30, "batch_size": 16},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "output": {"tensorboard": False},
    }
    run = tmp_path / "run"
    accumrun.train(config, run, quiet=True)
    model = (run / "tokenizer" / "sentence_piece.model").read_bytes()
    assert spm.SentencePieceProcessor(model_proto=model).get_piece_size() <= 320
    assert len(list((tmp_path / "cache").glob("corpus-*"))) == 1

    # Greedy generation reads the run's model back and continues the code with its layout, byte for byte.
    generated = accumrun.generate(run, "def parse(path", max_tokens=60)
    assert generated.continuation.count("\n") >= 3
    assert "\n        for line in file:\n" in generated.text
    assert generated.text in CODE * 2

    (run / "tokenizer" / "sentence_piece.model").unlink()
    with pytest.raises(ConfigError, match=r"RUN_DIR: has no tokenizer/sentence_piece\.model, the model that its"):
        accumrun.generate(run, "def", max_tokens=1)


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_export_names_the_import_that_its_loader_needs_and_loads_after_it(tmp_path: Path) -> None:
    # word_piece's export says the same: tests/test_tokenizers.py checks its wrote line.
    texts = write_text_folder(tmp_path / "texts", 16)
    tokenizer = {"name": "sentence_piece", "vocabulary_size": 300}
    config = {
        "seed": 1,
        "data": {"name": "text_folder", "path": str(texts), "tokenizer": tokenizer, "sequence_length": 16},
        "model": {"name": "tests.user_code:mlp", "hidden": []},  # the export is the test, not the model
        "training": {"epochs": 1, "batch_size": 8},
        "output": {"tensorboard": False},
    }
    accumrun.train(config, tmp_path / "run", quiet=True)
    exported = accumrun.export(tmp_path / "run")
    assert exported.describe().endswith(
        "-> probabilities, class_index, class_name (load it after `import tensorflow_text`)"
    )

    # A fresh process, as a server that never imported tensorflow_text: loading fails on the tokenizer's first op.
    script = "import sys, tensorflow as tf\ntf.saved_model.load(sys.argv[1])\n"
    loading = [sys.executable, "-c", script, str(exported.path)]
    done = subprocess.run(loading, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Op type not registered 'SentencepieceOp'" in done.stderr

    # Here, where tensorflow_text is imported, the SentencePiece export serves, tokenizing in its graph as the run's
    # tokenizer does on the host.
    texts = ["a great film", "dull\r\n\tand  tedious 😀"]
    serve = tf.saved_model.load(str(exported.path)).signatures["serving_default"]
    served = serve(texts=tf.constant(texts))["probabilities"].numpy()
    run = tmp_path / "run"
    model = (run / "tokenizer" / "sentence_piece.model").read_bytes()
    section = SentencePieceTokenizerConfig(name="sentence_piece", vocabulary_size=300).with_model(model)
    logits = keras.models.load_model(run / "model.keras")(tokenizer_for(section).encode(texts, 16))
    np.testing.assert_allclose(served, keras.ops.convert_to_numpy(keras.activations.softmax(logits)), atol=1e-6)
