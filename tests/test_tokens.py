"""``data.name: tokens``: a flat file of token ids (nanoGPT's ``train.bin``) reads as ``text_corpus`` reads the same
bytes, window for window, trains alike subdivided or not, and each bad file is one line that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accumrun import generate, train
from accumrun.config.schema import data_config
from accumrun.data.dataset import load_dataset
from accumrun.data.source import Source
from accumrun.errors import ConfigError, DataError
from tests.helpers import invoke, max_difference, write_config

TEXT = "The cat sees the moon. Naïve café, crème brûlée; emoji 😀 and Ωμέγα ≈ √2 €.\n" * 3


def write_ids(path: Path, ids: np.ndarray, dtype: str = "<u2") -> Path:
    path.write_bytes(np.asarray(ids).astype(dtype).tobytes())
    return path


def byte_files(tmp_path: Path) -> tuple[Path, Path]:
    """The same bytes as a text file and as a file of uint16 token ids."""
    text = tmp_path / "corpus.txt"
    text.write_text(TEXT, encoding="utf-8")
    return text, write_ids(tmp_path / "train.bin", np.frombuffer(text.read_bytes(), np.uint8))


def stream(split: Source) -> tuple[np.ndarray, np.ndarray]:
    """Every sample and target of a split in index order, as its stream gives them."""
    read = list(split.stream(0, 0, shuffle=False).as_numpy_iterator())
    return np.stack([x for _, x, _ in read]), np.stack([y for _, _, y in read])


@pytest.mark.parametrize("stride", [None, 7])
def test_a_token_file_of_bytes_gives_the_windows_of_a_text_corpus_with_the_byte_tokenizer(
    tmp_path: Path, stride: int | None
) -> None:
    text, tokens = byte_files(tmp_path)
    common = {"sequence_length": 16, "stride": stride, "validation_split": 0.25}
    corpus = load_dataset(data_config(name="text_corpus", path=str(text), **common), seed=3)
    from_ids = load_dataset(data_config(name="tokens", path=str(tokens), vocabulary_size=256, **common), seed=3)
    assert from_ids.vocabulary_size == corpus.vocabulary_size == 257
    assert from_ids.classes == corpus.classes
    for ours, theirs in ((from_ids.train, corpus.train), (from_ids.val, corpus.val)):
        assert ours is not None and theirs is not None
        assert ours.size == theirs.size
        for a, b in zip(stream(ours), stream(theirs), strict=True):
            np.testing.assert_array_equal(a, b)


def test_uint32_ids_are_shifted_up_by_one_and_the_top_id_fits(tmp_path: Path) -> None:
    top = 70_000  # beyond uint16, and the id that ends up one above it
    ids = np.array([0, 5, top - 1, 1, 2, 3, 4, 0, top - 1], np.uint32)
    path = write_ids(tmp_path / "big.bin", ids, "<u4")
    config = data_config(name="tokens", path=str(path), dtype="uint32", vocabulary_size=top, sequence_length=4)
    dataset = load_dataset(config.model_copy(update={"validation_split": 0.0}), seed=0)
    x, y = stream(dataset.train)
    # Windows of 4 from ids 0 and 4 (the second reaches the file's last id): every id one up, none left as padding.
    np.testing.assert_array_equal(x, [[1, 6, top, 2], [3, 4, 5, 1]])
    np.testing.assert_array_equal(y, [[6, top, 2, 3], [4, 5, 1, top]])
    assert dataset.classes == dataset.vocabulary_size == top + 1


@pytest.mark.slow
def test_training_on_a_token_file_subdivided_equals_the_text_corpus_of_its_bytes_plain(tmp_path: Path) -> None:
    text, tokens = byte_files(tmp_path)

    # 20 training windows in 2 batches of 10 (one batch shape: the step is traced once a run), 4 + 3 + 3 subdivided.
    def lm(subdivisions: int, **data: Any) -> dict[str, Any]:
        return {
            "seed": 1,
            "data": {"sequence_length": 12, "validation_split": 0.15, **data},
            # The window's model is no part of the test: test_lm's causal convolution traces fastest.
            "model": {"name": "tests.test_lm:causal_convolution"},
            "training": {"epochs": 2, "batch_size": 10, "subdivisions": subdivisions},
            "optimizer": {"name": "sgd", "learning_rate": 0.5},
            "output": {"tensorboard": False},
        }

    plain = train(lm(1, name="text_corpus", path=str(text)), tmp_path / "corpus", quiet=True)
    subdivided = train(lm(3, name="tokens", path=str(tokens), vocabulary_size=256), tmp_path / "ids", quiet=True)
    # 2e-5: float32 sums in another order (the bound of tests/test_lm.py's docstring, for 4 updates here).
    assert max_difference(subdivided.model.get_weights(), plain.model.get_weights()) < 2e-5
    assert [row["loss"] for row in subdivided.metrics] == pytest.approx(
        [row["loss"] for row in plain.metrics], abs=1e-5
    )
    # Without data.tokenizer the ids cannot be read or written as text: the error blames the tokenizer, not the run.
    with pytest.raises(ConfigError, match=r"^data\.tokenizer: generate reads the prompt .* has none") as refused:
        generate(tmp_path / "ids", "hello")
    assert str(tmp_path) not in refused.value.format_message()


@pytest.mark.parametrize(
    ("content", "data", "message"),
    [
        (b"\x01\x00\x02", {}, "holds 3 bytes, not a whole number of uint16 ids of 2 bytes (check data.dtype)"),
        (b"", {}, "is empty"),
        (np.arange(8, dtype="<u2").tobytes(), {}, "holds 8 tokens, fewer than one window of sequence_length + 1 = 9"),
        (np.array([1, 2, 300, 4] * 4, "<u2").tobytes(), {}, "token 2 is id 300, not below data.vocabulary_size 256"),
        (np.arange(20, dtype="<u4").tobytes(), {"dtype": "uint32", "vocabulary_size": 19}, "token 19 is id 19"),
    ],
    ids=["ragged", "empty", "short", "id-too-high", "uint32-id-too-high"],
)
def test_a_bad_token_file_is_one_line_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, data: dict[str, Any], message: str
) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes(content)
    section = {"name": "tokens", "path": str(path), "vocabulary_size": 256, "sequence_length": 8, **data}
    config = write_config(tmp_path / "bad.yaml", data=section, model={"name": "transformer", "layers": 1, "width": 8})
    monkeypatch.chdir(tmp_path)
    result = invoke("train", str(config))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: data.path: {path}")
    assert message in line


def test_make_example_tokens_writes_files_that_load(tmp_path: Path) -> None:
    result = invoke("make-example", "tokens", str(tmp_path / "tokens"), "--count", "20")
    assert result.returncode == 0, result.stderr
    train_file, val_file = tmp_path / "tokens" / "train.bin", tmp_path / "tokens" / "val.bin"
    assert f"path: {train_file}, validation_path: {val_file}, vocabulary_size: 256" in result.stdout
    config = data_config(name="tokens", path=str(train_file), validation_path=str(val_file), vocabulary_size=256)
    dataset = load_dataset(config, seed=0)
    assert dataset.train.size > dataset.val_size > 0
    ids = np.fromfile(train_file, "<u2")
    assert ids.max() < 256 and bytes(ids.astype(np.uint8)).decode("utf-8").endswith(".\n")


def test_missing_token_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="token file not found"):
        load_dataset(data_config(name="tokens", path=str(tmp_path / "none.bin"), vocabulary_size=9), seed=0)


def test_a_decoding_tokenizer_must_have_one_id_more_than_the_file(tmp_path: Path) -> None:
    _, tokens = byte_files(tmp_path)
    section = {"name": "tokens", "path": str(tokens), "vocabulary_size": 256, "sequence_length": 8}
    assert load_dataset(data_config(**section, tokenizer={"name": "byte"}), seed=0).vocabulary_size == 257
    with pytest.raises(ConfigError, match=r"has 300 ids with padding; .* decoded by one of 257 \(got 'character'\)"):
        load_dataset(data_config(**section, tokenizer={"name": "character", "vocabulary_size": 300}), seed=0)
