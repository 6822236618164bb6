"""``data.cache``: decoded images kept in memory or on disk give training exactly what decoding the files gives.

The image folders and TFRecord files are made in tmp_path. The disk cache is checked where it can go wrong: the
order and indices it serves (the file order and the TFRecord shuffle buffer), its key (a changed folder is never
served stale; an unchanged one is reused), a build that did not finish, and a folder it cannot write.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from accumrun import evaluate, load_config, train
from accumrun.config.loading import load_resume_config
from accumrun.config.schema import data_config
from accumrun.data.augment import Augmentation
from accumrun.data.cache import Cached
from accumrun.data.dataset import load_dataset
from accumrun.data.examples import encode, shape_images, write_image_folder
from accumrun.data.feeder import Feeder
from accumrun.data.read_ahead import ReadAhead
from accumrun.data.section import AugmentConfig, DataSection
from accumrun.data.source import ArraySource, Source
from accumrun.errors import ConfigError, DataError
from tests.helpers import invoke

SIZE = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 PNG images of 10x10 in three classes, resized to 8x8 when read."""
    return write_image_folder(tmp_path_factory.mktemp("images") / "shapes", count=24, size=10, seed=1)


def run_config(folder: Path, **data: Any) -> dict[str, Any]:
    """Two epochs of an MLP (no BatchNorm) on the folder: batch 8 in 3 sub-batches, a flip drawn per sample."""
    return {
        "seed": 4,
        "data": {
            "name": "image_folder",
            "path": str(folder),
            "image_size": [SIZE, SIZE],
            "validation_split": 0.25,
            "augment": [{"name": "random_flip", "mode": "horizontal"}],
        }
        | data,
        "model": {"name": "mlp", "hidden": [8]},
        "training": {"epochs": 2, "batch_size": 8, "subdivisions": 3},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "output": {"tensorboard": False},
    }


def epochs(
    split: Source, numbers: tuple[int, ...] = (0, 1), augment: bool = True, shuffle: bool = True
) -> list[np.ndarray]:
    """Every chunk of batch 5 the feeder serves in the epochs ``numbers`` of the split: samples, then labels."""
    augmentation = (
        Augmentation([AugmentConfig(name="random_flip")], split.sample_shape, np.dtype(np.uint8)) if augment else None
    )
    sizes = [5] * (split.size // 5) + ([split.size % 5] if split.size % 5 else [])
    feeder = Feeder(split, sizes, seed=7, shuffle=shuffle, augmentation=augmentation)
    return [part.numpy() for epoch in numbers for chunk in feeder.epoch(epoch) for part in chunk]


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for left, right in zip(a, b, strict=True):
        np.testing.assert_array_equal(left, right)


def disk_cached(images: Path, cache_dir: str) -> DataSection:
    """The data section of the image folder ``images``, all of it to train on, cached on disk in ``cache_dir``."""
    return data_config(
        name="image_folder",
        path=str(images),
        image_size=[SIZE, SIZE],
        validation_split=0,
        cache="disk",
        cache_dir=cache_dir,
    )


def folders(cache_dir: Path) -> list[str]:
    """The finished cache folders (a build in progress or killed is a hidden ``.NAME.*.partial``)."""
    return sorted(path.name for path in cache_dir.iterdir() if not path.name.startswith("."))


# --- training ---------------------------------------------------------------------------------------------------


def trained(config: dict[str, Any], run_dir: Path) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """A run's final weights and its metrics rows less what is measured (time, memory)."""
    result = train(config, run_dir, quiet=True)
    measured = ("seconds", "samples_per_second", "peak_rss_mib")
    rows = [{key: value for key, value in row.items() if key not in measured} for row in result.metrics]
    return [v.numpy() for v in result.model.variables], rows


@pytest.fixture(scope="module")
def uncached(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """The run that decodes the files as it trains (fed through ``tf.data``), to compare the cached ones to."""
    return trained(gathered_config(folder), tmp_path_factory.mktemp("uncached") / "run")


def gathered_config(folder: Path, **data: Any) -> dict[str, Any]:
    """:func:`run_config` without augmentation, for three epochs of 4 updates a call: the disk cache's batches are
    gathered a call at a time (one gather per batch, the next call's read ahead), and the arrays held in memory
    are trained several batches a call. Batches of 8, 8 and 2: a call's batches have one size, and the calls cross
    the ends of epochs."""
    training = {"epochs": 3, "batch_size": 8, "subdivisions": 3, "updates_per_call": 4}
    return run_config(folder, augment=[], **data) | {"training": training}


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_a_cached_run_trains_exactly_as_one_that_decodes_the_files(
    folder: Path,
    uncached: tuple[list[np.ndarray], list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cache: str,
) -> None:
    # Resident arrays (memory), the disk cache's gather, and tf.data (the files decoded): the same numbers, bit for
    # bit. That the caches serve augmented streams as decoding does is the test below's, at the feeder.
    reads: list[int] = []
    read = Feeder.read
    monkeypatch.setattr(
        Feeder, "read", lambda self, chunks, then: reads.append(len(chunks)) or read(self, chunks, then)
    )
    cache_dir = tmp_path / "cache"
    weights, rows = trained(gathered_config(folder, cache=cache, cache_dir=str(cache_dir)), tmp_path / "run")
    assert_same(weights, uncached[0])
    assert rows == uncached[1]
    if cache == "disk":
        # The validation split reads a batch at a time; training read the calls' batches.
        assert max(reads) == 2
        # One folder for the training files, one for the held-out ones.
        assert len(folders(cache_dir)) == 2
        # A finished run evaluates on its cached validation split as its last epoch did, to the bit.
        assert evaluate(tmp_path / "run")["loss"] == rows[-1]["val_loss"]


@pytest.mark.slow
def test_memory_and_disk_serve_the_decoded_images_in_the_same_order_and_draws(folder: Path, tmp_path: Path) -> None:
    def loaded(cache: str) -> Any:
        config = data_config(
            name="image_folder", path=str(folder), image_size=[SIZE, SIZE], cache=cache, cache_dir=str(tmp_path)
        )
        return load_dataset(config, seed=3)

    plain, memory, disk = loaded("none"), loaded("memory"), loaded("disk")
    # One wrapper for both: in memory, a split read by index offers its rows as arrays (held as one tensor).
    assert isinstance(memory.train, Cached) and not memory.streamed and memory.train.pixels is not None
    held = memory.train.in_memory
    assert isinstance(held, ArraySource) and held.x is memory.train.pixels  # the rows themselves, no copy
    assert isinstance(disk.train, Cached) and disk.streamed and disk.train.file is not None
    for split in ("train", "val"):
        expected = epochs(getattr(plain, split))
        assert_same(epochs(getattr(memory, split)), expected)
        assert_same(epochs(getattr(disk, split)), expected)
    # A subset (batch_norm: precise samples one) still finds its rows.
    chosen = np.array([5, 1, 9])
    assert_same(epochs(disk.train.subset(chosen), (0,)), epochs(plain.train.subset(chosen), (0,)))
    # Without augmentation, the disk cache is read a chunk at a time, without tf.data: the same chunks, from a skip too.
    feeders = [Feeder(split.train, [5, 5, 5], seed=7, shuffle=True) for split in (plain, disk)]
    for skip in (0, 2):
        assert_same(*[[part.numpy() for chunk in feeder.epoch(1, skip) for part in chunk] for feeder in feeders])


# --- the key ----------------------------------------------------------------------------------------------------


def test_a_changed_folder_gets_a_new_cache_and_an_unchanged_one_reuses_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = write_image_folder(tmp_path / "images", count=9, size=SIZE, seed=3)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # cache_dir's ~ is the home folder
    cache_dir = tmp_path / "home" / "cache"
    config = disk_cached(images, "~/cache")

    def first_epoch() -> np.ndarray:
        return np.concatenate(epochs(load_dataset(config, seed=0).train, (0,), augment=False, shuffle=False)[::2])

    before = first_epoch()
    [built] = folders(cache_dir)
    marker = (cache_dir / built / "x.npy").stat().st_mtime_ns
    np.testing.assert_array_equal(first_epoch(), before)
    assert folders(cache_dir) == [built]  # reused: no new folder, the old one not rewritten
    assert (cache_dir / built / "x.npy").stat().st_mtime_ns == marker

    # One pixel of one image changes: the file's size or time changes, so the key does, and training sees it.
    changed = images / "disc" / "00002.png"
    position = sorted(str(path) for path in images.rglob("*.png")).index(str(changed))
    image = before[position].copy()
    image[0, 0] = 255 - image[0, 0]
    changed.write_bytes(encode(image))
    after = first_epoch()
    np.testing.assert_array_equal(after[position], image)
    assert len(folders(cache_dir)) == 2

    (images / "bars" / "00099.png").write_bytes(encode(shape_images(1, SIZE, seed=9)[0][0]))
    assert len(first_epoch()) == 10 and len(folders(cache_dir)) == 3


def test_a_build_that_did_not_finish_is_never_read(tmp_path: Path) -> None:
    images = write_image_folder(tmp_path / "images", count=9, size=SIZE, seed=3)
    cache_dir = tmp_path / "cache"
    config = disk_cached(images, str(cache_dir))
    plain = epochs(load_dataset(config.model_copy(update={"cache": "none"}), seed=0).train, (0,))
    assert_same(epochs(load_dataset(config, seed=0).train, (0,)), plain)
    # As a build that was killed would leave it: its samples cut short (here renamed into place by hand), and a
    # partial folder beside it.
    [built] = folders(cache_dir)
    samples = cache_dir / built / "x.npy"
    samples.write_bytes(samples.read_bytes()[:-5])
    (cache_dir / f".{built}.123-0badcafe.partial").mkdir()
    (cache_dir / f".{built}.123-0badcafe.partial" / "x.npy").write_bytes(b"\xff" * 3)
    assert_same(epochs(load_dataset(config, seed=0).train, (0,)), plain)
    assert samples.stat().st_size > 5 and folders(cache_dir) == [built]


def test_a_cache_cut_short_after_startup_fails_the_epoch_in_one_line(tmp_path: Path) -> None:
    images = write_image_folder(tmp_path / "images", count=9, size=SIZE, seed=3)
    split = load_dataset(disk_cached(images, str(tmp_path / "cache")), seed=0).train
    assert isinstance(split, Cached) and split.file is not None
    feeder = Feeder(split, [5, 4], seed=0, shuffle=False)
    assert len(list(feeder.epoch(0))) == 2
    with open(split.file, "r+b") as file:
        file.truncate(file.seek(0, 2) - 5)
    message = rf"^data: reading the data failed: {re.escape(split.file)} holds \d+ bytes, a read reaches byte \d+$"
    with pytest.raises(DataError, match=message):
        list(feeder.epoch(0))


def test_reading_ahead_reads_each_chunk_once_and_drops_what_is_not_asked_for() -> None:
    read: list[int] = []
    ahead: ReadAhead[int, int] = ReadAhead(lambda key: read.append(key) or key * 10)
    assert ahead.take([0, 1], then=[2, 3, 4]) == [0, 10]
    assert ahead.take([2], then=[3, 4, 5]) == [20]  # a shorter call than foreseen: the rest stays read ahead
    assert ahead.take([3, 4, 5, 6], then=[8]) == [30, 40, 50, 60]  # a longer one reads the rest now
    assert ahead.take([7], then=[]) == [70]  # 8, foreseen in vain, is dropped
    assert ahead.take([8], then=[]) == [80]
    # Each read once, in the order asked, but 8: asked for again after it was dropped, if the reader had not begun it.
    assert read[:7] == list(range(7)) and sorted(set(read)) == list(range(9)) and len(read) - read.count(8) == 8


# --- errors and config ------------------------------------------------------------------------------------------


def test_a_cache_dir_that_cannot_be_written_is_one_line(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    config = run_config(folder, cache="disk", cache_dir=str(tmp_path / "a-file" / "cache"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = invoke("train", str(path), "--run-dir", str(tmp_path / "run"), "--quiet")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: data.cache_dir: cannot write the image cache there ("), lines
    assert lines[0].endswith(f"(got '{tmp_path / 'a-file' / 'cache'}')")


def test_cache_is_a_key_of_the_sources_that_read_files_as_they_train(tmp_path: Path) -> None:
    sources = "image_folder or tfrecord or csv or tfds or text_folder or text_corpus or jsonl"
    with pytest.raises(ConfigError, match=rf"data\.cache: only applies to data\.name: {sources} \(got 'disk'\)"):
        load_config({"data": {"name": "npz", "path": "x.npz", "cache": "disk"}})
    with pytest.raises(ConfigError, match=r"data\.cache: input should be 'none', 'memory' or 'disk' \(got 'ram'\)"):
        load_config({"data": {"name": "image_folder", "path": "x", "image_size": [8, 8], "cache": "ram"}})
    assert load_config({"data": {"name": "tfds", "dataset": "x", "image_size": [8, 8]}}).data.cache == "none"


def test_a_run_resumes_with_another_cache(tmp_path: Path) -> None:
    config = load_config(run_config(tmp_path))
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    resumed = load_resume_config(tmp_path, None, ["data.cache=disk", "data.cache_dir=/tmp/elsewhere"])
    assert (resumed.data.cache, resumed.data.cache_dir) == ("disk", "/tmp/elsewhere")
    with pytest.raises(ConfigError, match=r"data\.color_mode"):
        load_resume_config(tmp_path, None, ["data.color_mode=grayscale"])


_BUILDER = """
import sys, time
from pathlib import Path
import numpy as np
from accumrun.rundir.atomic import build_once

root, me, attempts = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rows = np.arange(4096, dtype=np.int64).reshape(64, 64)

def complete(found):
    try:
        return np.array_equal(np.load(found / "x.npy", mmap_mode="r"), rows)
    except (OSError, ValueError):
        return False

def build(partial):
    partial.mkdir()
    np.save(partial / "x.npy", rows)

for attempt in range(attempts):
    # A barrier: both processes start building the attempt's folder at once (to the millisecond of the polls).
    (root / f"ready{attempt}-{me}").touch()
    while len(list(root.glob(f"ready{attempt}-*"))) < 2:
        time.sleep(0.001)
    folder = root / "cache" / f"folder{attempt}"
    build_once(folder, complete, build)
    assert complete(folder), attempt
"""


@pytest.mark.slow
def test_two_processes_that_build_one_cache_at_once_both_end_with_it_complete(tmp_path: Path) -> None:
    """The race of two runs over the same files: each builds beside the name and renames into place; the loser
    reads the winner's folder, and neither removes the other's. Twenty times in a row, by the same two processes
    (a barrier starts each attempt in both at once), so that the twenty races, not forty interpreter starts, are
    the cost."""
    import subprocess
    import sys

    script = tmp_path / "build.py"
    script.write_text(_BUILDER)
    attempts = 20
    processes = [
        subprocess.Popen([sys.executable, str(script), str(tmp_path), str(me), str(attempts)], stderr=subprocess.PIPE)
        for me in range(2)
    ]
    errors = [process.communicate(timeout=120)[1].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0], errors
    for attempt in range(attempts):
        folder = tmp_path / "cache" / f"folder{attempt}"
        assert sorted(path.name for path in folder.iterdir()) == ["x.npy"]
    assert not [path for path in (tmp_path / "cache").iterdir() if path.name.startswith(".")]  # no partial left
