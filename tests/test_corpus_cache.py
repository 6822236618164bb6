"""A text corpus with ``data.cache: disk``: tokenized once, piece by piece, into a token file that later runs find;
its windows, read from that file, are those of the corpus held in memory, sample for sample, so a run on disk
trains as one in memory.

Tolerance of the run on disk, streamed and bucketed, against the run in memory (``LM_TOLERANCE``, 2e-5): both take
the same 3 SGD updates (rate 0.2) from the same weights on the same 177 windows; padding is masked, so a token's
forward pass reads the same numbers; they differ in how the gradient's mean over a batch's up to 59 * 24 = 1416
tokens is summed (once, or in three sub-batch sums weighted by their tokens) and in the padded shapes. Each term is
a layer-normed activation (at most sqrt(16) = 4 in size at width 16) times a softmax error (at most 1 a token);
Higham's worst case for regrouping a sum of n terms is n * 2^-24 relative to the sum of magnitudes, but rounding
errors add as a random walk: sqrt(1416) * 2^-24 * 4 = 9e-6 per run, 1.8e-5 between the runs, and three updates at
0.2 carry 3 * 0.2 * 1.8e-5 = 1.1e-5 into a weight, under the 2e-5.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accumrun import load_config, train
from accumrun.config.schema import data_config
from accumrun.data.corpus import CorpusWindows, file_ids, token_file
from accumrun.data.dataset import epoch_order, load_dataset
from accumrun.data.examples import write_corpus
from accumrun.data.feeder import Feeder
from accumrun.data.grouping import LengthGroups
from accumrun.data.source import ArraySource, Source
from accumrun.data.tokenizers import tokenizer_for
from accumrun.data.tokenizers.byte import ByteTokenizerConfig
from accumrun.data.tokenizers.character import CharacterTokenizerConfig
from accumrun.data.tokenizers.word_piece import WordPieceTokenizerConfig
from accumrun.data.vocabulary import settle_vocabulary
from accumrun.errors import DataError
from accumrun.training.console import describe_setup
from accumrun.training.setup import build_training
from tests.helpers import max_difference

LINES = [
    "The cat sees the moon.",
    "",
    "naïve café, crème brûlée, e\u0301 combining",
    "emoji 😀👍🏽 and a flag 🇫🇷 " * 3,
    "Ωμέγα ≈ √2 €\r",
    "  indented\ttabs   and spaces  ",
    "a line far longer than one piece: " + "the film was very good, " * 8,
]
LM_TOLERANCE = 2e-5
VOCABULARY = ["[PAD]", "[UNK]", "the", "film", "was", "good", "bad", "a", "##s", "very", ".", ",", "cat", "moon"]


def corpus(tmp_path: Path, stride: int | None = None, **data: Any) -> dict[str, Any]:
    """The data section of 6 generated files (each file's last window short), windows of 24 tokens."""
    folder = tmp_path / "corpus"
    if not folder.exists():
        write_corpus(folder, 6, seed=4)
    section = {"name": "text_corpus", "path": str(folder), "sequence_length": 24, "validation_split": 0.2}
    return {**section, "stride": stride, "cache_dir": str(tmp_path / "cache"), **data}


def samples(split: Source) -> tuple[np.ndarray, np.ndarray]:
    """Every sample and target of a split, in index order, as its reader gives them."""
    if isinstance(split, ArraySource):
        return split.x, split.y
    streamed = list(split.stream(0, 0, shuffle=False).as_numpy_iterator())
    assert [int(index) for index, _, _ in streamed] == list(range(split.size))
    return np.stack([x for _, x, _ in streamed]), np.stack([y for _, _, y in streamed])


@pytest.mark.parametrize(
    "tokenizer",
    [
        ByteTokenizerConfig(name="byte"),
        CharacterTokenizerConfig(name="character", vocabulary_size=300),  # accents in, emoji unknown
        CharacterTokenizerConfig(name="character", vocabulary_size=200_000),
        "word_piece",
    ],
    ids=["byte", "character-300", "character-200000", "word_piece"],
)
def test_a_file_tokenized_in_pieces_at_line_breaks_gives_the_whole_text_ids(tmp_path: Path, tokenizer: Any) -> None:
    if tokenizer == "word_piece":
        (tmp_path / "vocabulary.txt").write_text("\n".join(VOCABULARY) + "\n")
        tokenizer = WordPieceTokenizerConfig(name="word_piece", vocabulary=str(tmp_path / "vocabulary.txt"))
    text = "\n".join(LINES * 5)  # no line break at the end
    (tmp_path / "text.txt").write_bytes(text.encode("utf-8"))
    encoder = tokenizer_for(tokenizer)
    whole = encoder.ids(text)
    for piece_bytes in (1, 16, 100, 1 << 20):
        pieces = list(file_ids(tmp_path / "text.txt", "data.path", encoder, piece_bytes))
        assert len(pieces) > 1 or piece_bytes == 1 << 20
        np.testing.assert_array_equal(np.concatenate(pieces), whole, err_msg=str(piece_bytes))


def test_cache_none_cuts_the_windows_from_the_ids_as_they_are_read_and_memory_is_the_default(tmp_path: Path) -> None:
    unset = load_dataset(data_config(**corpus(tmp_path, 7)), seed=3)
    memory = load_dataset(data_config(**corpus(tmp_path, 7, cache="memory")), seed=3)
    none = load_dataset(data_config(**corpus(tmp_path, 7, cache="none")), seed=3)
    assert data_config(**corpus(tmp_path)).cache == "memory"
    assert isinstance(unset.train, ArraySource) and isinstance(memory.train, ArraySource)
    assert isinstance(none.train, CorpusWindows) and none.train.held is not None and none.train.in_memory is None
    # The ids are held: the feed decides as for windows held (not streamed), the same numbers either way.
    assert not none.streamed and not memory.streamed
    assert none.val is not None and memory.val is not None
    for mine, theirs in ((none.train, memory.train), (none.val, memory.val)):
        x, y = samples(mine)
        np.testing.assert_array_equal(x, theirs.x)
        np.testing.assert_array_equal(y, theirs.y)
        np.testing.assert_array_equal(mine.lengths, np.count_nonzero(theirs.x, axis=1))
    sizes = [10] * (memory.train_size // 10)
    for epoch in (0, 1):
        fed = Feeder(none.train, sizes, seed=3, shuffle=True).epoch(epoch, skip=2)
        held = Feeder(memory.train, sizes, seed=3, shuffle=True).epoch(epoch, skip=2)
        for (x, y), (x_held, y_held) in zip(fed, held, strict=True):
            np.testing.assert_array_equal(x.numpy(), x_held.numpy())
            np.testing.assert_array_equal(y.numpy(), y_held.numpy())


@pytest.mark.parametrize("stride", [None, 7])
def test_windows_read_from_the_token_file_are_the_windows_held_in_memory(tmp_path: Path, stride: int | None) -> None:
    held = load_dataset(data_config(**corpus(tmp_path, stride)), seed=3)
    disk = load_dataset(data_config(**corpus(tmp_path, stride, cache="disk")), seed=3)
    assert isinstance(held.train, ArraySource) and isinstance(disk.train, CorpusWindows)
    assert disk.streamed and not held.streamed
    assert (disk.target_shape, disk.classes, disk.val_size) == (held.target_shape, held.classes, held.val_size)
    assert held.val is not None and disk.val is not None
    for mine, theirs in ((disk.train, held.train), (disk.val, held.val)):
        x, y = samples(mine)
        np.testing.assert_array_equal(x, theirs.x)
        np.testing.assert_array_equal(y, theirs.y)
        assert isinstance(mine, CorpusWindows)
        np.testing.assert_array_equal(mine.lengths, np.count_nonzero(theirs.x, axis=1))
    # Grouped by length (data.bucket), each batch holds the same windows, shortest first, and a resumed epoch
    # (skipping the first windows) reads on where it left off.
    assert isinstance(disk.train, CorpusWindows)
    groups = LengthGroups(disk.train.lengths, (10,) * (disk.train_size // 10))
    grouped = [int(index) for index, _, _ in disk.train.stream(1, 3, True, 0, groups).as_numpy_iterator()]
    order = epoch_order(disk.train_size, 3, 1, True)
    for start in range(0, len(order) - 9, 10):
        assert sorted(grouped[start : start + 10]) == sorted(order[start : start + 10])
        assert np.all(np.diff(disk.train.lengths[grouped[start : start + 10]]) >= 0)
    resumed = [int(index) for index, _, _ in disk.train.stream(1, 3, True, 13, groups).as_numpy_iterator()]
    assert resumed == grouped[13:] and grouped != list(order)

    lengths = np.count_nonzero(np.concatenate([held.train.y, held.val.y]), axis=1)
    assert lengths.min() < (12 if stride is None else 24) and lengths.max() == 24  # short last windows, full ones


@pytest.mark.slow
def test_a_learned_vocabulary_reads_and_keys_the_token_file(tmp_path: Path) -> None:
    tokenizer = {"name": "word_piece", "vocabulary_size": 100}
    settled = settle_vocabulary(data_config(**corpus(tmp_path, tokenizer=tokenizer)), 0, None)
    held = load_dataset(settled, seed=0)
    disk = load_dataset(
        settle_vocabulary(data_config(**corpus(tmp_path, tokenizer=tokenizer, cache="disk")), 0, None), 0
    )
    assert isinstance(held.train, ArraySource) and isinstance(disk.train, CorpusWindows)
    x, y = samples(disk.train)
    np.testing.assert_array_equal(x, held.train.x)
    np.testing.assert_array_equal(y, held.train.y)
    # Other tokens are another tokenizer: another token file.
    assert settled.tokenizer.tokens is not None
    other = settled.tokenizer.with_tokens(settled.tokenizer.tokens[:-1])
    files = sorted((tmp_path / "corpus").glob("*.txt"))
    again = token_file(files, "data.path", tokenizer_for(settled.tokenizer), settled.tokenizer, str(tmp_path / "cache"))
    assert again.path == Path(disk.train.file)
    changed = token_file(files, "data.path", tokenizer_for(other), other, str(tmp_path / "cache"))
    assert changed.path.parent != again.path.parent


def test_a_second_run_finds_the_token_file_and_a_changed_file_makes_a_new_one(tmp_path: Path) -> None:
    files = sorted(write_corpus(tmp_path / "corpus", 4, seed=1).glob("*.txt"))
    tokenizer = ByteTokenizerConfig(name="byte")
    cache = str(tmp_path / "cache")
    first = token_file(files, "data.path", tokenizer_for(tokenizer), tokenizer, cache)
    stat = first.path.stat()
    # Each file's ids end where the sum of the files' bytes says (byte tokens), in the files' sorted order.
    np.testing.assert_array_equal(first.ends, np.cumsum([file.stat().st_size for file in files]))
    second = token_file(files, "data.path", tokenizer_for(tokenizer), tokenizer, cache)
    assert second.path == first.path
    assert (second.path.stat().st_ino, second.path.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)

    with files[2].open("a", encoding="utf-8") as file:
        file.write("One more line.\n")
    changed = token_file(files, "data.path", tokenizer_for(tokenizer), tokenizer, cache)
    assert changed.path.parent != first.path.parent and first.path.is_file()
    tokens = np.fromfile(changed.path, "<i4")
    assert bytes((tokens[changed.ends[1] : changed.ends[2]] - 1).astype(np.uint8)) == files[2].read_bytes()

    # A folder without its marker (damaged, or left by hand) is not a cache: it is built again.
    (changed.path.parent / "complete").unlink()
    rebuilt = token_file(files, "data.path", tokenizer_for(tokenizer), tokenizer, cache)
    assert rebuilt.path == changed.path and (changed.path.parent / "complete").is_file()
    np.testing.assert_array_equal(np.fromfile(rebuilt.path, "<i4"), tokens)
    assert sorted(path.name.startswith(".") for path in Path(cache).iterdir()) == [False, False]  # no partial left


@pytest.mark.slow
def test_a_language_model_on_disk_subdivided_trains_as_one_in_memory(tmp_path: Path) -> None:
    def lm(**data: Any) -> dict[str, Any]:
        return {
            "seed": 1,
            "data": corpus(tmp_path, 12, **data),
            "model": {"name": "transformer", "layers": 1, "heads": 2, "width": 16},
            "training": {"epochs": 1, "batch_size": 59, "subdivisions": 1},
            "optimizer": {"name": "sgd", "learning_rate": 0.2},
            "output": {"tensorboard": False},
        }

    plain = train(lm(), tmp_path / "plain", quiet=True)
    # That a config saying cache: none (the default before memory was) trains as memory does is the windows' test
    # above: the same windows, the same feed, the same chunks fed.
    # 177 training windows in 3 batches of 59 (one batch shape: the step is traced once a run), each in 3 (20, 20,
    # 19 windows) streamed one sub-batch per call, each batch grouped by length and each
    # sub-batch padded to its longest window rounded up to 8 (of 24 tokens).
    config = lm(cache="disk", feed="sub_batch", bucket=8)
    config["training"]["subdivisions"] = 3
    run = train(config, tmp_path / "disk", quiet=True)
    assert run.model.input_shape == (None, None)
    assert max_difference(run.model.get_weights(), plain.model.get_weights()) < LM_TOLERANCE


def test_a_bad_file_on_disk_is_refused_in_one_line(tmp_path: Path) -> None:
    corpus(tmp_path)  # the files
    bad = tmp_path / "corpus" / "00003.txt"
    bad.write_bytes(b"ok line\n" * 300 + b"caf\xe9\n")
    with pytest.raises(DataError, match=rf"^data\.path: {re.escape(str(bad))} is not UTF-8 text \(byte 2403\)"):
        load_dataset(data_config(**corpus(tmp_path, cache="disk")), seed=0)
    assert not list((tmp_path / "cache").iterdir())  # the partial build is gone
    bad.write_bytes(b"")
    with pytest.raises(DataError, match=rf"^data\.path: {re.escape(str(bad))} is empty"):
        load_dataset(data_config(**corpus(tmp_path, cache="disk")), seed=0)

    # A token file cut short after its run began (say, by hand) fails the epoch in one line, naming it.
    bad.write_text("a fine text again\n")
    split = load_dataset(data_config(**corpus(tmp_path, cache="disk")), seed=0).train
    assert isinstance(split, CorpusWindows)
    with open(split.file, "r+b") as file:
        file.truncate(4 * int(split.ends[2]))
    message = rf"^data: reading the data failed: {re.escape(split.file)} holds \d+ bytes, a read reaches byte"
    with pytest.raises(DataError, match=message):
        list(Feeder(split, [10] * (split.size // 10), seed=0, shuffle=False).epoch(0))


def test_the_startup_summary_names_the_disk_cache_and_the_bucket(tmp_path: Path) -> None:
    data = corpus(tmp_path, cache="disk", bucket=8)
    config = {"data": data, "model": {"name": "transformer", "layers": 1, "width": 8}, "training": {"batch_size": 8}}
    (line,) = [line for line in describe_setup(build_training(load_config(config))) if line.startswith("input")]
    assert f"disk cache (token file under {tmp_path / 'cache'})" in line
    assert "bucket 8 (a sub-batch padded to its longest text, a multiple of it)" in line
