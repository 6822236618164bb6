"""A learned WordPiece vocabulary (``data.tokenizer: {name: word_piece, vocabulary_size: N}``): learned from the
training split's texts when a run starts (those the validation hold-out keeps, by the rule that
:func:`accumrun.data.dataset.load_dataset` splits by), saved in the run folder as ``tokenizer/vocabulary.txt``, and
read back from there by a resumed run and by ``evaluate``, ``predict``, ``export`` and ``generate``, so all tokenize
as training did. A ``text_corpus`` is cut into windows only once there is a vocabulary, so it learns from all of
``data.path``'s files (only a ``data.validation_path`` keeps validation text out).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from accumrun.data.corpus import read_text
from accumrun.data.section import DataSection
from accumrun.data.splits import hold_out
from accumrun.data.tables import read_records, read_texts
from accumrun.data.text import corpus_files, folder_files
from accumrun.data.tokenizer_sections import WordPieceTokenizerConfig
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub
from accumrun.rundir.layout import VOCABULARY_FILE, read_vocabulary


def settle_vocabulary(data: DataSection, seed: int, run_dir: Path | None) -> DataSection:
    """``data`` with a learned vocabulary's tokens settled: read from ``run_dir``'s ``tokenizer/vocabulary.txt``
    (a resumed or finished run), or, with ``run_dir`` None (a new run), learned from the training texts. Any other
    ``data`` comes back as it is. A ``run_dir`` without one is a ConfigError."""
    config = learned_tokenizer(data)
    if config is None:
        return data
    tokens = learn_vocabulary(training_texts(data, seed), config) if run_dir is None else read_vocabulary(run_dir)
    if tokens is None:
        what = f"has no {VOCABULARY_FILE.as_posix()}, the vocabulary that its data.tokenizer learned"
        raise ConfigError("RUN_DIR", what, str(run_dir))
    return data.model_copy(update={"tokenizer": config.with_tokens(tokens)})


def learned_tokenizer(data: DataSection) -> WordPieceTokenizerConfig | None:
    """``data.tokenizer`` where it learns its vocabulary (``vocabulary_size``), else None."""
    tokenizer = getattr(data, "tokenizer", None)
    return tokenizer if isinstance(tokenizer, WordPieceTokenizerConfig) and tokenizer.learned else None


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
