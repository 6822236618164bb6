"""The tokenizers: their ids, the same on the host and in a TensorFlow graph, back to text, and their config."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from accumrun import evaluate, export, load_config, predict, train
from accumrun.config.schema import data_config
from accumrun.data.dataset import load_dataset
from accumrun.data.examples import write_text_folder
from accumrun.data.feeder import Feeder
from accumrun.data.tokenizers import TOKENIZER_UNION, Tokenizer, learning_of, tokenizer_for
from accumrun.data.tokenizers import TOKENIZERS as KINDS
from accumrun.data.tokenizers.byte import ByteTokenizer, ByteTokenizerConfig
from accumrun.data.tokenizers.character import CharacterTokenizer
from accumrun.data.tokenizers.preset import PresetTokenizerConfig
from accumrun.data.tokenizers.word_piece import WordPieceTokenizerConfig
from accumrun.data.vocabulary import settle_vocabulary, training_texts
from accumrun.errors import ConfigError
from accumrun.kinds import Task
from accumrun.training.console import describe_setup
from accumrun.training.setup import build_training
from tests.helpers import invoke, write_config

TRICKY = [
    "",
    "hé",
    "naïve café, crème brûlée",
    "emoji 😀👍🏽 and a flag 🇫🇷",
    "e\u0301 combining, \u00a0nbsp, \u200bzero width",
    "Ωμέγα ≈ √2 €",
    "tab\tnew\nline\x00nul",
    "a much longer text than any length the test cuts it to, " * 3,
]
TOKENIZERS: list[Tokenizer] = [ByteTokenizer(), CharacterTokenizer(258), CharacterTokenizer(70_000)]


def test_byte_tokens_are_utf8_bytes_plus_one_cut_or_padded_with_zero() -> None:
    tokenizer = ByteTokenizer()
    np.testing.assert_array_equal(tokenizer.encode(["hé"], 5), [[ord("h") + 1, 0xC3 + 1, 0xA9 + 1, 0, 0]])
    np.testing.assert_array_equal(tokenizer.encode(["abcdef", ""], 3), [[98, 99, 100], [0, 0, 0]])
    assert tokenizer.vocabulary_size == 257


def test_character_tokens_are_code_points_plus_two_or_unknown_above_the_vocabulary() -> None:
    latin = CharacterTokenizer(258)
    np.testing.assert_array_equal(latin.encode(["hé€😀"], 6), [[ord("h") + 2, 0xE9 + 2, 1, 1, 0, 0]])
    wide = CharacterTokenizer(0x20AC + 3)  # just holds the euro sign
    np.testing.assert_array_equal(wide.encode(["€😀", "\x00"], 2), [[0x20AC + 2, 1], [2, 0]])


@pytest.mark.parametrize("tokenizer", TOKENIZERS, ids=lambda t: f"{type(t).__name__}-{t.vocabulary_size}")
def test_the_graph_encodes_exactly_as_the_host(tokenizer: Tokenizer) -> None:
    for length in (1, 7, 16, 300):
        host = tokenizer.encode(TRICKY, length)
        graph = tokenizer.encode_tensor(tf.constant(TRICKY), length)
        assert graph.dtype == tf.int32 and host.dtype == np.int32
        np.testing.assert_array_equal(graph.numpy(), host)
        assert host.shape == (len(TRICKY), length)
        assert host.max() < tokenizer.vocabulary_size
    # Inside a compiled function, with an unknown batch size, as a serving signature runs it.
    traced = tf.function(
        lambda texts: tokenizer.encode_tensor(texts, 16), input_signature=[tf.TensorSpec([None], tf.string)]
    )
    np.testing.assert_array_equal(traced(tf.constant(TRICKY)).numpy(), tokenizer.encode(TRICKY, 16))


def test_decode_gives_the_text_back_skipping_padding() -> None:
    for tokenizer in (ByteTokenizer(), CharacterTokenizer(0x110000 + 2)):
        for text in TRICKY:
            ids = tokenizer.encode([text], 400)[0]
            assert tokenizer.decode(ids) == text
            assert tokenizer.decode(list(ids)) == text
    assert CharacterTokenizer(258).decode([ord("a") + 2, 1, 0, ord("b") + 2, 0]) == "a\ufffdb"
    assert ByteTokenizer().decode(ByteTokenizer().encode(["é"], 1)[0]) == "\ufffd"  # half a character, cut
    with pytest.raises(ValueError, match="token id 257 is outside the vocabulary of 257 ids"):
        ByteTokenizer().decode([1, 257])


def test_each_kind_is_registered_once_and_declares_what_it_learns_and_where_a_run_keeps_it() -> None:
    assert (
        list(TOKENIZER_UNION)
        == [*KINDS, "unknown"]
        == ["byte", "character", "word_piece", "sentence_piece", "preset", "unknown"]
    )
    kept = {name: kind.learning.file.as_posix() for name, kind in KINDS.items() if kind.learning is not None}
    assert kept == {"word_piece": "tokenizer/vocabulary.txt", "sentence_piece": "tokenizer/sentence_piece.model"}
    # A word_piece learns only where it is given a vocabulary_size, not a file; a fixed kind never does.
    fixed = WordPieceTokenizerConfig(name="word_piece", vocabulary="v.txt")
    learned = WordPieceTokenizerConfig(name="word_piece", vocabulary_size=100)
    assert learning_of(fixed) is None and learning_of(learned) is KINDS["word_piece"].learning
    assert learning_of(ByteTokenizerConfig(name="byte")) is None


def test_a_corpus_is_cut_into_windows_of_its_tokenizers_ids(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("héllo wörld", encoding="utf-8")
    tokenizer = {"name": "character", "vocabulary_size": 240}  # ö (U+00F6) is unknown, é (U+00E9) is not
    config = data_config(name="text_corpus", path=str(tmp_path / "a.txt"), tokenizer=tokenizer, sequence_length=4,
                         validation_split=0.0)  # fmt: skip
    dataset = load_dataset(config, seed=0)
    ids = CharacterTokenizer(240).ids("héllo wörld")
    assert list(ids[[1, 7]]) == [0xE9 + 2, 1]
    # Windows of 5 tokens, 4 apart: inputs are their first 4, targets their last 4; the last window is short.
    np.testing.assert_array_equal(dataset.train.x, [ids[0:4], ids[4:8], [*ids[8:10], 0, 0]])
    np.testing.assert_array_equal(dataset.train.y, [ids[1:5], ids[5:9], [*ids[9:11], 0, 0]])
    assert (dataset.task, dataset.vocabulary_size) == (Task.CAUSAL_LM, 240)


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        (
            {"name": "word"},
            r"^Error: data\.tokenizer\.name: input should be 'byte', 'character', 'word_piece', 'sentence_piece' or "
            r"'preset' \(got 'word'\)$",
        ),
        (
            {"name": "word_piece", "vocabulary": "missing.txt"},
            r"^Error: data\.tokenizer\.vocabulary: vocabulary file not found \(got 'missing\.txt'\)$",
        ),
        (
            {"name": "preset", "path": "."},
            r"^Error: data\.tokenizer\.path: holds no KerasHub tokenizer \(tokenizer\.json\)",
        ),
        ({"name": "character", "vocabulary_size": 2}, r"^Error: data\.tokenizer\.vocabulary_size: .*equal to 3"),
        ({"name": "byte", "size": 3}, r"^Error: data\.tokenizer\.size: unknown key; known keys: name$"),
        (
            {"name": "word_piece"},
            r"^Error: data\.tokenizer: set one of vocabulary \(a file\) and vocabulary_size \(learned from the "
            r"training texts\) \(got \{'name': 'word_piece'\}\)$",
        ),
        (
            {"name": "word_piece", "vocabulary": "v.txt", "vocabulary_size": 500},
            r"^Error: data\.tokenizer: set one of vocabulary .*, not both \(got ",
        ),
        (
            {"name": "word_piece", "vocabulary_size": 99},
            r"^Error: data\.tokenizer\.vocabulary_size: input should be greater than or equal to 100 \(got 99\)$",
        ),
    ],
)
def test_a_bad_tokenizer_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer: dict[str, object], message: str
) -> None:
    data = {"name": "text_folder", "path": "texts", "tokenizer": tokenizer}
    path = write_config(tmp_path / "bad.yaml", data=data, model={"name": "transformer", "width": 8})
    monkeypatch.chdir(tmp_path)
    result = invoke("check", str(path))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert re.search(message, line), line


def test_a_word_piece_file_without_its_unknown_token_is_refused_in_accumruns_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "v.txt").write_text("[PAD]\nhello\n")
    data = {"name": "text_folder", "path": "texts", "tokenizer": {"name": "word_piece", "vocabulary": "v.txt"}}
    monkeypatch.chdir(tmp_path)
    result = invoke("check", str(write_config(tmp_path / "bad.yaml", data=data, model={"name": "transformer"})))
    assert (result.returncode, result.stderr) == (
        1,
        "Error: data.tokenizer.vocabulary: v.txt has no [UNK] line, the token for a word WordPiece cannot cut; add it "
        "after [PAD], the first line\n",
    )


VOCABULARY = ["[PAD]", "[UNK]", "the", "film", "was", "good", "bad", "a", "##s", "very", ".", ","]


def test_word_piece_from_a_file_and_from_a_preset_folder_encode_alike_on_host_and_graph(tmp_path: Path) -> None:
    import keras_hub

    (tmp_path / "vocabulary.txt").write_text("\n".join(VOCABULARY) + "\n")
    from_file = tokenizer_for(WordPieceTokenizerConfig(name="word_piece", vocabulary=str(tmp_path / "vocabulary.txt")))
    # A preset folder as KerasHub writes one: the backbone's config.json beside the tokenizer's files.
    keras_hub.tokenizers.WordPieceTokenizer(vocabulary=VOCABULARY, lowercase=True).save_to_preset(
        str(tmp_path / "preset")
    )
    backbone = keras_hub.models.BertBackbone(len(VOCABULARY), 1, 2, 8, 16, max_sequence_length=8)
    backbone.save_to_preset(str(tmp_path / "preset"))
    from_preset = tokenizer_for(PresetTokenizerConfig(name="preset", path=str(tmp_path / "preset")))
    texts = ["The films were very good.", "a bad film, zebra", "", *TRICKY]
    expected = from_file.encode(texts, 6)
    np.testing.assert_array_equal(expected[0], [2, 3, 8, 1, 9, 5])  # "were" is unknown
    for tokenizer in (from_file, from_preset):
        assert tokenizer.vocabulary_size == len(VOCABULARY)
        np.testing.assert_array_equal(tokenizer.encode(texts, 6), expected)
        np.testing.assert_array_equal(tokenizer.encode_tensor(tf.constant(texts), 6).numpy(), expected)
        # In an input pipeline's graph too (KerasHub's eager tokenizer splits "line\x00nul" in two, its graph not).
        pipeline = tf.data.Dataset.from_tensors(texts).map(lambda batch, t=tokenizer: t.encode_tensor(batch, 6))
        np.testing.assert_array_equal(next(iter(pipeline)).numpy(), expected)
    assert from_file.decode(from_file.ids("the film was good.")) == "the film was good ."

    # A vocabulary whose id 0 is a real token cannot pad.
    (tmp_path / "unpadded.txt").write_text("\n".join(VOCABULARY[1:]) + "\n")
    with pytest.raises(ConfigError, match=r"its id 0 is '\[UNK\]', a real token; accumrun pads with id 0"):
        tokenizer_for(WordPieceTokenizerConfig(name="word_piece", vocabulary=str(tmp_path / "unpadded.txt")))


NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett", "kilo", "lima"]


def write_named_texts(tmp_path: Path, source: str) -> tuple[dict[str, object], list[str]]:
    """Twelve texts, each with a word of its own (said often enough for the learner to keep it whole), as a text
    folder, a CSV or JSON Lines; the data section and the texts in the source's sample order."""
    texts = [f"review {i} of the film " + " ".join([name] * 12) for i, name in enumerate(NAMES)]
    labels = ["negative", "positive"] * 6
    path = tmp_path / "data"
    if source == "text_folder":
        for i, (text, label) in enumerate(zip(texts, labels, strict=True)):
            (path / label).mkdir(parents=True, exist_ok=True)
            (path / label / f"{i:02d}.txt").write_text(text, encoding="utf-8")
        ordered = [
            text for label in ("negative", "positive") for text, own in zip(texts, labels, strict=True) if own == label
        ]
        return {"name": "text_folder", "path": str(path)}, ordered
    if source == "csv":
        with (path := path.with_suffix(".csv")).open("w", newline="") as file:
            csv.writer(file).writerows([["text", "label"], *zip(texts, labels, strict=True)])
        return {"name": "csv", "path": str(path), "text": "text", "label": "label"}, texts
    path = path.with_suffix(".jsonl")
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels, strict=True)))
    return {"name": "jsonl", "path": str(path), "label": "label"}, texts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "shuffle"),
    # A text folder draws its hold-out seeded whether or not it shuffles; a CSV and JSON Lines share the table's
    # hold-out (seeded when shuffled, the tail when not): each path once, each source once.
    [("text_folder", False), ("csv", True), ("jsonl", False)],
)
def test_a_vocabulary_is_learned_from_the_training_texts_alone_and_the_same_each_time(
    tmp_path: Path, source: str, shuffle: bool
) -> None:
    section, ordered = write_named_texts(tmp_path, source)
    tokenizer = {"name": "word_piece", "vocabulary_size": 1000}
    data = data_config(**section, tokenizer=tokenizer, validation_split=0.25, sequence_length=20, shuffle=shuffle)
    # The hold-out, written out: the tail of the seed's permutation of the samples is validation, or without
    # shuffling the table's own tail; a text folder's files (listed class by class) are always drawn seeded.
    seeded = shuffle or source == "text_folder"
    kept = np.random.default_rng(7).permutation(12)[:9] if seeded else np.arange(9)
    assert training_texts(data, seed=7) == [ordered[i] for i in kept]

    settled = settle_vocabulary(data, 7, None)
    tokens = settled.tokenizer.tokens
    assert tokens is not None and tokens[:2] == ("[PAD]", "[UNK]") and len(tokens) < 1000
    assert settle_vocabulary(data, 7, None).tokenizer.tokens == tokens  # learning again learns the same
    trained = {name for i, name in enumerate(NAMES) if any(name in ordered[j] for j in kept)}
    assert len(trained) == 9 and trained <= set(tokens)  # each training text's own word, whole
    assert not (set(NAMES) - trained) & set(tokens)  # the validation texts' words: never
    # The samples are the learned tokenizer's ids of the same texts, in the same order (a text folder's streamed).
    dataset = load_dataset(settled, seed=7)
    (x, _), *_ = Feeder(dataset.train, [dataset.train_size], seed=7, shuffle=False).epoch(0)
    np.testing.assert_array_equal(x.numpy(), tokenizer_for(settled.tokenizer).encode(training_texts(data, 7), 20))
    assert dataset.vocabulary_size == len(tokens)


def test_a_corpus_learns_from_all_its_files(tmp_path: Path) -> None:
    texts = ["the cat sees the moon. " * 12, "a dog finds the river. " * 10, "my sister paints a boat. " * 11]
    for index, text in enumerate(texts):
        (tmp_path / f"{index}.txt").write_text(text, encoding="utf-8")
    tokenizer = {"name": "word_piece", "vocabulary_size": 100}
    data = data_config(name="text_corpus", path=str(tmp_path), tokenizer=tokenizer, sequence_length=8)
    assert training_texts(data, seed=0) == texts  # windows are cut from tokens: the files are learned whole
    settled = settle_vocabulary(data, 0, None)
    assert settled.tokenizer.tokens is not None and {"cat", "river", "boat"} <= set(settled.tokenizer.tokens)
    dataset = load_dataset(settled, seed=0)
    assert dataset.val is not None  # validation_split 0.1 of the windows
    ids = tokenizer_for(settled.tokenizer).ids(texts[0])
    # The first file's first window is a sample (its text repeats, so its later windows may be the same ids).
    assert any(list(row) == list(ids[:8]) for row in np.concatenate([dataset.train.x, dataset.val.x]))
    assert dataset.vocabulary_size == len(settled.tokenizer.tokens) and "[UNK]" not in tokenizer_for(
        settled.tokenizer
    ).decode(ids)


@pytest.mark.slow
def test_a_run_saves_its_vocabulary_and_every_later_reader_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorflow_text  # noqa: F401  (the export's WordPiece ops)

    folder = write_text_folder(tmp_path / "texts", 40)
    config = {
        "seed": 1,
        "data": {
            "name": "text_folder",
            "path": str(folder),
            "tokenizer": {"name": "word_piece", "vocabulary_size": 100},
            "sequence_length": 16,
            "validation_split": 0.25,
        },
        "model": {"name": "transformer", "layers": 1, "heads": 2, "width": 16},
        # One pass per batch: the vocabulary is the test, not the accumulation (a plain step traces fastest).
        "training": {"epochs": 1, "batch_size": 10, "subdivisions": 1},
        "optimizer": {"name": "sgd", "learning_rate": 0.3},
        "output": {"tensorboard": False},
    }
    run = tmp_path / "run"
    result = train(config, run, quiet=True)
    learned = settle_vocabulary(load_config(config).data, 1, None).tokenizer.tokens
    assert learned is not None and learned[0] == "[PAD]"
    saved = (run / "tokenizer" / "vocabulary.txt").read_text(encoding="utf-8")
    assert saved == "".join(f"{token}\n" for token in learned)
    assert result.model.get_layer("token_embedding").input_dim == len(learned)
    assert "vocabulary_size: 100" in (run / "config.yaml").read_text()
    # evaluate splits and tokenizes as training did: the last row's validation loss, to the bit (the same scorer).
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert evaluate(run)["loss"] == row["val_loss"]

    # predict and the exported SavedModel (strings in, the saved vocabulary inside) give the same probabilities.
    texts = ["a great film", "dull and tedious, quite awful", "réussi", "zebra"]
    for index, text in enumerate(texts):
        (tmp_path / f"{index}.txt").write_text(text, encoding="utf-8")
    rows = predict(run, [str(tmp_path / f"{index}.txt") for index in range(len(texts))]).records()
    labels = ["negative", "positive"]
    predicted = np.array([[row[f"top{i}_prob"] for i in (1, 2)] for row in rows])
    order = np.array([[labels.index(row[f"top{i}_class"]) for i in (1, 2)] for row in rows])
    exported = export(run)
    assert exported.describe().endswith("class_name (load it after `import tensorflow_text`)")
    serve = tf.saved_model.load(str(exported.path)).signatures["serving_default"]
    served = serve(texts=tf.constant(texts))["probabilities"].numpy()
    np.testing.assert_allclose(np.take_along_axis(served, order, axis=1), predicted, atol=1e-5)

    # New texts in the same files: learning now would learn other words, but a resumed run reads its own.
    rng = np.random.default_rng(0)
    for path in folder.rglob("*.txt"):
        path.write_text(" ".join(rng.choice(["zebra", "quokka", "narwhal", "axolotl"], size=8)), encoding="utf-8")
    relearned = settle_vocabulary(load_config(config).data, 1, None).tokenizer.tokens
    assert relearned is not None and "quokka" in relearned and "quokka" not in learned
    more = {**config, "training": {**config["training"], "epochs": 2}}
    resumed = build_training(load_config(more), resumed=run)
    expected = tokenizer_for(
        WordPieceTokenizerConfig(name="word_piece", vocabulary=str(run / "tokenizer" / "vocabulary.txt"))
    )
    (x, _), *_ = Feeder(resumed.fed.dataset.train, [resumed.fed.dataset.train_size], seed=1, shuffle=False).epoch(0)
    np.testing.assert_array_equal(x.numpy(), expected.encode(training_texts(load_config(more).data, 1), 16))
    line = f"tokenizer word_piece: {len(learned)} ids learned from the training texts (at most 100), kept in the run's "
    assert line + "tokenizer/vocabulary.txt" in describe_setup(resumed)
    train(more, run, quiet=True, resume=True)
    assert (run / "tokenizer" / "vocabulary.txt").read_text(encoding="utf-8") == saved
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2

    # A run folder that lost its vocabulary is refused in one line.
    (run / "tokenizer" / "vocabulary.txt").unlink()
    monkeypatch.chdir(tmp_path)
    refused = invoke("predict", str(run), str(tmp_path / "0.txt"))
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"Error: RUN_DIR: has no tokenizer/vocabulary.txt, the vocabulary that its data.tokenizer learned (got '{run}')"
    )
