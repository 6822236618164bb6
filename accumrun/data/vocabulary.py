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
from accumrun.data.json_lines import read_records
from accumrun.data.section import DataSection
from accumrun.data.splits import hold_out
from accumrun.data.tables import read_texts
from accumrun.data.text import corpus_files, folder_files
from accumrun.data.tokenizers import learning_of
from accumrun.data.tokenizers.base import Learning, TokenizerSection
from accumrun.errors import ConfigError


def settle_vocabulary(data: DataSection, seed: int, run_dir: Path | None) -> DataSection:
    """``data`` with a learned tokenizer settled: read from ``run_dir``'s ``tokenizer/`` (a resumed or finished run),
    or, with ``run_dir`` None (a new run), learned from the training texts. Any other ``data`` comes back as it is.
    A ``run_dir`` without the file is a ConfigError."""
    learned = _learned(data)
    if learned is None:
        return data
    config, learning = learned
    if run_dir is None:
        found = learning.learn(training_texts(data, seed), config)
    else:
        found = learning.read(run_dir)
        if found is None:
            what = f"has no {learning.file.as_posix()}, the {learning.noun} that its data.tokenizer learned"
            raise ConfigError("RUN_DIR", what, str(run_dir))
    return data.model_copy(update={"tokenizer": learning.settle(config, found)})


def save_learned(run_dir: Path, data: DataSection) -> None:
    """Write what ``data.tokenizer`` learned (settled) into ``run_dir``'s ``tokenizer/``; nothing for another."""
    learned = _learned(data)
    if learned is not None:
        config, learning = learned
        found = learning.settled(config)
        assert found is not None  # settle_vocabulary settles it before any data is read
        learning.write(run_dir, found)


def learned_line(data: DataSection) -> str | None:
    """The startup line of a settled learned tokenizer: its ids, the most it may have, and where the run keeps it."""
    learned = _learned(data)
    if learned is None:
        return None
    config, learning = learned
    found = learning.settled(config)
    if found is None:
        return None
    return (
        f"tokenizer {config.name}: {learning.size(found):,} ids learned from the training texts (at most "
        f"{config.learns_at_most:,}), kept in the run's {learning.file.as_posix()}"
    )


def _learned(data: DataSection) -> tuple[TokenizerSection, Learning[Any, Any]] | None:
    """``data.tokenizer`` and how it learns, where it learns from the training texts; else None."""
    settings = data.text_settings
    learning = None if settings is None else learning_of(settings[0])
    return None if settings is None or learning is None else (settings[0], learning)


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
    "jsonl": lambda data: read_records(Path(data.path), "data.path", data.text, data.label)[0],
    "csv": lambda data: read_texts(Path(data.path), "data.path", data.text),
}
"""The texts of ``data.path`` in sample order, for each source that a learned tokenizer reads."""
