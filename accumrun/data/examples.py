"""Example data to try the file sources on (``accumrun make-example``), made from ``--seed``, never downloaded.

The images are three classes of shapes (horizontal bars, vertical bars, a disc) drawn in random colours, sizes
and places over noise, so they are learnable but not at a glance. The tests use the same writers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from accumrun.errors import DataError

SHAPES = ("bars", "columns", "disc")


def shape_images(count: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uint8 RGB images of ``size`` x ``size``, with labels cycling through :data:`SHAPES`."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(SHAPES)
    images = rng.integers(0, 90, size=(count, size, size, 3)).astype(np.float32)
    rows, cols = np.mgrid[0:size, 0:size]
    for image, label in zip(images, labels, strict=True):
        colour = rng.integers(120, 256, size=3)
        period = int(rng.integers(3, max(4, size // 4)))
        phase = int(rng.integers(period))
        if SHAPES[label] == "bars":
            mask = (rows + phase) % period < period // 2
        elif SHAPES[label] == "columns":
            mask = (cols + phase) % period < period // 2
        else:
            centre = rng.uniform(size * 0.3, size * 0.7, size=2)
            mask = (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 < (rng.uniform(0.15, 0.35) * size) ** 2
        image[mask] = 0.6 * image[mask] + colour
    return np.clip(images, 0, 255).astype(np.uint8), labels


def encode(image: np.ndarray) -> bytes:
    """PNG bytes of a uint8 image (TensorFlow's encoder)."""
    import tensorflow as tf

    return bytes(tf.io.encode_png(image).numpy())


def write_image_folder(folder: Path, count: int = 300, size: int = 32, seed: int = 0) -> Path:
    """An image folder of ``count`` images: one subfolder per shape, ``<shape>/<index>.png``."""
    images, labels = shape_images(count, size, seed)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        target = folder / SHAPES[label] / f"{index:05d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(encode(image))
    return folder


def write_tfrecords(path: Path, count: int = 300, size: int = 32, seed: int = 0, shards: int = 2) -> list[Path]:
    """``shards`` TFRecord files ``<path>-0000i-of-0000n`` of ``tf.train.Example``: ``image/encoded`` (PNG) and
    ``image/class/label`` (int64), the layout of common ImageNet-style TFRecords."""
    import tensorflow as tf

    images, labels = shape_images(count, size, seed)
    files = [path.with_name(f"{path.name}-{i:05d}-of-{shards:05d}") for i in range(shards)]
    path.parent.mkdir(parents=True, exist_ok=True)
    for shard, file in enumerate(files):
        with tf.io.TFRecordWriter(str(file)) as writer:
            for index in range(shard, count, shards):
                image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[encode(images[index])]))
                label = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[index])]))
                feature = {"image/encoded": image, "image/class/label": label}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return files


def write_csv(path: Path, count: int = 600, features: int = 6, seed: int = 0) -> Path:
    """A table of ``count`` rows: an ``id`` column (text, not a feature), ``features`` numeric columns and a
    ``species`` label of three names, separable by a random linear map of the features."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.9, size=(3, features))
    labels = rng.integers(3, size=count)
    x = centres[labels] + rng.normal(size=(count, features))
    names = np.array(["adelie", "chinstrap", "gentoo"])
    lines = [",".join(["id", *(f"f{j}" for j in range(features)), "species"])]
    lines += [",".join([f"s{i:04d}", *(f"{v:.4f}" for v in x[i]), str(names[labels[i]])]) for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


REVIEW_WORDS = {
    "negative": ["bad", "dull", "awful", "tedious", "weak", "mauvais"],
    "positive": ["good", "great", "lovely", "moving", "superb", "réussi"],
}
_FILLER = ["the", "film", "was", "and", "a", "plot", "acting", "quite", "very"]


def write_text_folder(folder: Path, count: int = 600, seed: int = 0) -> Path:
    """``count`` short reviews in ``negative/`` and ``positive/`` (one ``.txt`` each, UTF-8, a few with accented
    words): 1 to 24 words, some of them the class's own, so the real lengths differ widely."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        label = ["negative", "positive"][index % 2]
        words = rng.choice([*REVIEW_WORDS[label], *_FILLER], size=int(rng.integers(1, 25)))
        path = folder / label / f"{index:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(" ".join(words), encoding="utf-8")
    return folder


_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "a small bird", "the teacher", "our neighbour"]
_VERBS = ["sees", "finds", "likes", "paints", "follows", "carries", "watches"]
_OBJECTS = ["the red ball", "a green hat", "the river", "an apple", "the little boat", "a letter", "the moon"]
_PLACES = ["in the garden", "at night", "by the sea", "after school", "in the rain", "near the bridge"]


def write_corpus(folder: Path, count: int = 600, seed: int = 0) -> Path:
    """``count`` ``.txt`` files of simple English sentences for a language model: 1 to 30 sentences each, so the
    files' lengths (and the last window of each) differ widely."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        sentences = []
        for _ in range(int(rng.integers(1, 31))):
            parts = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
            if rng.random() < 0.5:
                parts.append(rng.choice(_PLACES))
            sentences.append(" ".join(str(part) for part in parts).capitalize() + ".")
        (folder / f"{index:05d}.txt").write_text(" ".join(sentences) + "\n", encoding="utf-8")
    return folder


def write_tokens(folder: Path, count: int = 600, seed: int = 0) -> tuple[Path, Path]:
    """nanoGPT's ``train.bin`` and ``val.bin`` for :func:`write_corpus`'s sentences (``count`` texts, a tenth of
    them for validation): each text's UTF-8 bytes as uint16 ids 0..255, so ``vocabulary_size: 256``."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as texts:
        files = sorted(write_corpus(Path(texts), count, seed).glob("*.txt"))
        held = max(1, count // 10)
        for name, part in (("train.bin", files[:-held]), ("val.bin", files[-held:])):
            data = b"".join(file.read_bytes() for file in part)
            (folder / name).write_bytes(np.frombuffer(data, np.uint8).astype("<u2").tobytes())
    return folder / "train.bin", folder / "val.bin"


def write_random_labels(path: Path, digits: Path, seed: int = 0) -> Path:
    """The bundled ``digits`` as an npz for the edge of stability (Cohen et al., ICLR 2021): each image's 64 pixels
    standardized over the set (a constant pixel left at 0), and one-hot targets of the labels permuted at random
    (from ``seed``), so that a regression on them cannot fit its way to a vanishing loss before the sharpness has
    risen."""
    with np.load(digits) as stored:
        x, y = stored["x"].reshape(len(stored["x"]), -1).astype(np.float64), stored["y"]
    spread = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    targets = np.eye(10, dtype=np.float32)[np.random.default_rng(seed).permutation(y)]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x.astype(np.float32), y=targets)
    return path


def require_new_target(target: Path) -> None:
    """Refuse a ``target`` that holds something already: an example never writes over data."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise DataError(str(target), "already exists; choose another target or remove it")


def _make_images(target: Path, count: int, size: int, seed: int) -> list[str]:
    write_image_folder(target, count, size, seed)
    return [f"wrote {count:,} images to {target}"]


def _make_tfrecord(target: Path, count: int, size: int, seed: int) -> list[str]:
    shards = write_tfrecords(target, count, size, seed)
    return [
        f"wrote {count:,} images to {len(shards)} shards, {shards[0].name} to {shards[-1].name}",
        f"train on them with data.path: {target}",
    ]


def _make_csv(target: Path, count: int, size: int, seed: int) -> list[str]:
    write_csv(target, count, seed=seed)
    return [f"wrote {count:,} rows to {target}"]


def _make_text(target: Path, count: int, size: int, seed: int) -> list[str]:
    write_text_folder(target, count, seed)
    return [f"wrote {count:,} texts to {target}"]


def _make_corpus(target: Path, count: int, size: int, seed: int) -> list[str]:
    write_corpus(target, count, seed)
    return [f"wrote {count:,} text files to {target}"]


def _make_tokens(target: Path, count: int, size: int, seed: int) -> list[str]:
    train, val = write_tokens(target, count, seed)
    return [
        f"wrote the bytes of {count:,} texts as uint16 token ids to {train} and {val}",
        # The byte tokenizer decodes these ids (shifted by one past padding), so `generate` can print text; it
        # cannot be added on resume, so the printed config carries it.
        f"train on them with data: {{name: tokens, path: {train}, validation_path: {val}, vocabulary_size: 256, "
        "tokenizer: {name: byte}}",
    ]


def _make_random_labels(target: Path, count: int, size: int, seed: int) -> list[str]:
    from accumrun.data.arrays import DIGITS_FILE

    write_random_labels(target, DIGITS_FILE, seed)
    return [f"wrote the bundled digits with labels permuted at random (seed {seed}) to {target}"]


# Each kind of ``accumrun make-example``, in the order its help lists them: a writer of (target, count, image side,
# seed) that returns the lines saying what it wrote.
_MAKERS: dict[str, Callable[[Path, int, int, int], list[str]]] = {
    "images": _make_images,
    "tfrecord": _make_tfrecord,
    "csv": _make_csv,
    "text": _make_text,
    "corpus": _make_corpus,
    "tokens": _make_tokens,
    "random-labels": _make_random_labels,
}
EXAMPLE_KINDS = tuple(_MAKERS)


def make_example(kind: str, target: Path, count: int, size: int, seed: int) -> list[str]:
    """Write the example data ``kind`` (one of :data:`EXAMPLE_KINDS`) in ``target``: ``count`` images, rows, texts
    or files, images ``size`` pixels wide, all drawn from ``seed``. Returns the lines that say what was written."""
    return _MAKERS[kind](target, count, size, seed)
