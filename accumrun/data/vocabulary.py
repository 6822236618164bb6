"""A learned WordPiece vocabulary (``data.tokenizer: {name: word_piece, vocabulary_size: N}``): learned from the
training split's texts when a run starts, saved in the run folder as ``tokenizer/vocabulary.txt``, and read back
from there by a resumed run and by ``evaluate``, ``predict``, ``export`` and ``generate``, so that all of them
tokenize as training did, whatever has become of the data since.

:func:`settle_vocabulary` is the one way to a learned vocabulary: it returns the data section with the tokens
settled (:meth:`~accumrun.data.tokenizer_sections.WordPieceTokenizerConfig.with_tokens`), which every tokenizer
then reads.

The training texts are the samples that the validation hold-out keeps for training: the source's own readers give
``data.path``'s texts in sample order (read from the file here, whether the source then streams them or holds their
token ids in memory: ``data.cache``), and :func:`accumrun.data.splits.hold_out`, the rule that
:func:`accumrun.data.dataset.load_dataset` splits by, picks them, so no validation text is ever learned from. A
``data.validation_path`` (or a split of 0) leaves all of ``data.path`` for training. A ``text_corpus`` is cut into
windows of token ids, which exist only once there is a vocabulary, so it learns from all of ``data.path``'s files,
before its windows are split: a corpus's validation windows are its last ones in the seed's order, and their text
may be in the vocabulary (``data.validation_path`` keeps validation text out).

The learner is KerasHub's ``compute_word_piece_vocabulary``: the same texts give the same vocabulary, ``[PAD]``
first (id 0 pads) and ``[UNK]`` second, and it lowercases as the tokenizer does (``data.tokenizer.lowercase``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from accumrun.data.jsonl import read_records
from accumrun.data.section import DataSection
from accumrun.data.splits import hold_out
from accumrun.data.tables import read_texts
from accumrun.data.text import corpus_texts, folder_texts
from accumrun.data.tokenizer_sections import WordPieceTokenizerConfig
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub
from accumrun.rundir.layout import VOCABULARY_FILE, read_vocabulary

RESERVED_TOKENS = ("[PAD]", "[UNK]")
"""The learned vocabulary's first tokens: padding (id 0) and the unknown token, KerasHub WordPiece's ``oov_token``."""


def settle_vocabulary(data: DataSection, seed: int, run_dir: Path | None) -> DataSection:
    """``data`` with a learned vocabulary's tokens settled: read from ``run_dir``'s ``tokenizer/vocabulary.txt``
    (a resumed or finished run), or, with ``run_dir`` None (a new run), learned from the training texts. Any other
    ``data`` comes back as it is.

    Raises:
        ConfigError: ``run_dir`` holds no saved vocabulary; KerasHub is not installed.
        DataError: the texts cannot be read (as the source's loader would say).
    """
    config = learned_tokenizer(data)
    if config is None:
        return data
    if run_dir is None:
        tokens = learn_vocabulary(training_texts(data, seed), config)
    else:
        saved = read_vocabulary(run_dir)
        if saved is None:
            raise ConfigError(
                "RUN_DIR",
                f"has no {VOCABULARY_FILE.as_posix()}, the vocabulary that its data.tokenizer learned",
                str(run_dir),
            )
        tokens = saved
    return data.model_copy(update={"tokenizer": config.with_tokens(tokens)})


def learned_tokenizer(data: DataSection) -> WordPieceTokenizerConfig | None:
    """``data.tokenizer`` where it learns its vocabulary (``vocabulary_size``), else None."""
    tokenizer = getattr(data, "tokenizer", None)
    if isinstance(tokenizer, WordPieceTokenizerConfig) and tokenizer.learned:
        return tokenizer
    return None


def training_texts(data: DataSection, seed: int) -> list[str]:
    """The texts of the training samples, in sample order (see the module's docstring).

    Raises:
        DataError: the texts cannot be read, or the hold-out leaves no validation sample.
    """
    read, samples = _TEXTS[data.name]
    texts = read(data)
    if not samples:  # a corpus, cut into windows once there is a vocabulary: all of its texts (see above)
        return texts
    # load_dataset's rule: a validation file (or the test split, or none) leaves data.path whole.
    fraction = data.validation_split
    if data.validation_file or fraction == "test" or fraction == 0:
        return texts
    # A text folder streams its files: load_dataset draws their hold-out seeded, whatever data.shuffle says. A
    # table's rows hold out by the table's rule, streamed or in memory.
    kept, _ = hold_out(len(texts), fraction, seed, data.shuffle, files=data.labelled_files)
    return [texts[i] for i in kept]


_TEXTS: dict[str, tuple[Callable[[Any], list[str]], bool]] = {
    "text_corpus": (lambda data: corpus_texts(data.path, "data.path"), False),
    "text_folder": (lambda data: folder_texts(Path(data.path), "data.path")[0], True),
    "jsonl": (lambda data: read_records(Path(data.path), "data.path", data)[0], True),
    "csv": (lambda data: read_texts(Path(data.path), "data.path", data.text), True),
}
"""The texts of ``data.path`` in sample order, for each source that a learned tokenizer reads, and whether each
text is one sample (so the hold-out picks them)."""


def learn_vocabulary(texts: list[str], config: WordPieceTokenizerConfig) -> tuple[str, ...]:
    """A WordPiece vocabulary of at most ``config.vocabulary_size`` tokens learned from ``texts``.

    Raises:
        ConfigError: KerasHub is not installed (the message names the extra).
    """
    assert config.vocabulary_size is not None
    keras_hub = import_keras_hub("data.tokenizer")
    import tensorflow as tf

    tokens = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(texts),
        config.vocabulary_size,
        lowercase=config.lowercase,
        reserved_tokens=list(RESERVED_TOKENS),
    )
    return tuple(str(token) for token in tokens)
