"""A learned vocabulary (``data.tokenizer: {name: word_piece, vocabulary_size: N}``) or SentencePiece model
(``{name: sentence_piece, vocabulary_size: N}``): learned from the training split's texts when a run starts (those the
validation hold-out keeps, by the rule that :func:`accumrun.data.dataset.load_dataset` splits by), saved in the run
folder as ``tokenizer/vocabulary.txt`` or ``tokenizer/sentence_piece.model``, and read back from there by a resumed
run and by ``evaluate``, ``predict``, ``export`` and ``generate``, so all tokenize as training did. A ``text_corpus``
is cut into windows only once there is a vocabulary, so it learns from all of ``data.path``'s files (only a
``data.validation_path`` keeps validation text out).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from accumrun.data.corpus import read_text
from accumrun.data.section import DataSection
from accumrun.data.sentence_piece import learn_sentence_piece, sentence_piece_size
from accumrun.data.splits import hold_out
from accumrun.data.tables import read_records, read_texts
from accumrun.data.text import corpus_files, folder_files
from accumrun.data.tokenizer_sections import SentencePieceTokenizerConfig, WordPieceTokenizerConfig
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub
from accumrun.rundir.layout import (
    SENTENCE_PIECE_FILE,
    VOCABULARY_FILE,
    read_sentence_piece,
    read_vocabulary,
    write_sentence_piece,
    write_vocabulary,
)

Learned = WordPieceTokenizerConfig | SentencePieceTokenizerConfig
"""A ``data.tokenizer`` section that learns from the training texts."""


def settle_vocabulary(data: DataSection, seed: int, run_dir: Path | None) -> DataSection:
    """``data`` with a learned tokenizer settled: read from ``run_dir``'s ``tokenizer/`` (a resumed or finished run),
    or, with ``run_dir`` None (a new run), learned from the training texts. Any other ``data`` comes back as it is.
    A ``run_dir`` without the file is a ConfigError."""
    config = learned_tokenizer(data)
    if config is None:
        return data
    if run_dir is None:
        return data.model_copy(update={"tokenizer": _learn(config, training_texts(data, seed))})
    settled = _read(config, run_dir)
    if settled is None:
        path, noun = _saved_file(config)
        what = f"has no {path.as_posix()}, the {noun} that its data.tokenizer learned"
        raise ConfigError("RUN_DIR", what, str(run_dir))
    return data.model_copy(update={"tokenizer": settled})


def learned_tokenizer(data: DataSection) -> Learned | None:
    """``data.tokenizer`` where it learns from the training texts (``vocabulary_size``), else None."""
    tokenizer = getattr(data, "tokenizer", None)
    learns = isinstance(tokenizer, WordPieceTokenizerConfig | SentencePieceTokenizerConfig) and tokenizer.learned
    return tokenizer if learns else None


def save_learned(run_dir: Path, data: DataSection) -> None:
    """Write what ``data.tokenizer`` learned (settled) into ``run_dir``'s ``tokenizer/``; nothing for another."""
    config = learned_tokenizer(data)
    if isinstance(config, SentencePieceTokenizerConfig):
        assert config.model is not None  # settle_vocabulary settles it before any data is read
        write_sentence_piece(run_dir, config.model)
    elif config is not None:
        assert config.tokens is not None  # and its tokens likewise
        write_vocabulary(run_dir, config.tokens)


def learned_line(data: DataSection) -> str | None:
    """The startup line of a settled learned tokenizer: its ids, the most it may have, and where the run keeps it."""
    config = learned_tokenizer(data)
    if isinstance(config, SentencePieceTokenizerConfig) and config.model is not None:
        ids = sentence_piece_size(config.model)
    elif isinstance(config, WordPieceTokenizerConfig) and config.tokens is not None:
        ids = len(config.tokens)
    else:
        return None
    return (
        f"tokenizer {config.name}: {ids:,} ids learned from the training texts (at most {config.vocabulary_size:,}), "
        f"kept in the run's {_saved_file(config)[0].as_posix()}"
    )


def _learn(config: Learned, texts: list[str]) -> Learned:
    """``config`` with what it learns from ``texts``."""
    if isinstance(config, SentencePieceTokenizerConfig):
        return config.with_model(learn_sentence_piece(texts, config))
    return config.with_tokens(learn_vocabulary(texts, config))


def _read(config: Learned, run_dir: Path) -> Learned | None:
    """``config`` with what the run in ``run_dir`` learned, or None when the run's file is missing."""
    if isinstance(config, SentencePieceTokenizerConfig):
        model = read_sentence_piece(run_dir)
        return None if model is None else config.with_model(model)
    tokens = read_vocabulary(run_dir)
    return None if tokens is None else config.with_tokens(tokens)


def _saved_file(config: Learned) -> tuple[Path, str]:
    """Where a run keeps what ``config`` learned, and what to call it."""
    if isinstance(config, SentencePieceTokenizerConfig):
        return SENTENCE_PIECE_FILE, "model"
    return VOCABULARY_FILE, "vocabulary"


def training_texts(data: DataSection, seed: int) -> list[str]:
    """The texts of the training samples, in sample order, read as the source's loader reads them."""
    texts = _TEXTS[data.name](data)
    # load_dataset's rule: a validation file (or the test split, or none) leaves data.path whole. A corpus is cut
    # into windows once there is a vocabulary: it learns from all of its texts (see above).
    fraction = data.validation_split
    if data.name == "text_corpus" or data.validation_file or fraction == "test" or fraction == 0:
        return texts
    # A text folder streams its files: load_dataset draws their hold-out seeded, whatever data.shuffle says. A
    # table's rows hold out by the table's rule, streamed or in memory.
    kept, _ = hold_out(len(texts), fraction, seed, data.shuffle, files=data.labelled_files)
    return [texts[i] for i in kept]


_TEXTS: dict[str, Callable[[Any], list[str]]] = {
    "text_corpus": lambda data: [read_text(file, "data.path") for file in corpus_files(data.path, "data.path")],
    "text_folder": lambda data: [
        read_text(Path(path), "data.path") for path in folder_files(Path(data.path), "data.path")[0]
    ],
    "jsonl": lambda data: read_records(Path(data.path), "data.path", data)[0],
    "csv": lambda data: read_texts(Path(data.path), "data.path", data.text),
}
"""The texts of ``data.path`` in sample order, for each source that a learned tokenizer reads."""


def learn_vocabulary(texts: list[str], config: WordPieceTokenizerConfig) -> tuple[str, ...]:
    """A WordPiece vocabulary of at most ``config.vocabulary_size`` tokens learned from ``texts`` by KerasHub."""
    assert config.vocabulary_size is not None
    keras_hub = import_keras_hub("data.tokenizer")
    import tensorflow as tf

    tokens = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(texts),
        config.vocabulary_size,
        lowercase=config.lowercase,
        reserved_tokens=["[PAD]", "[UNK]"],  # padding (id 0) first, then KerasHub WordPiece's oov_token
    )
    return tuple(str(token) for token in tokens)
