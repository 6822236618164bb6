"""Benchmark accumrun's data streaming: peak memory as an image folder grows, uint8 against float32 arrays, and
streamed image files (decoded each epoch, or kept by ``data.cache``) against the same images in memory.

Every measurement runs in a fresh child process (this script again, with ``--child``), one after another, so each
peak RSS is one run's own: the child's ``ru_maxrss`` from ``resource.getrusage(RUSAGE_SELF)`` once it is done,
for the whole process, TensorFlow included. This process imports neither TensorFlow nor NumPy, so the little a
child inherits from it at fork does not count. The runs, all through ``accumrun.train(config, run_dir,
quiet=True)``:

1. memory: darknet_cnn (filters [16, 32], strides [2, 2]) for one epoch on image folders of 2,000 and 16,000
   64x64x3 PNGs, at batch 64 in 4 sub-batches, then at ``batch_size: full`` in sub-batches of 64 (32 and 250 of
   them), where ``data.feed: auto`` streams sub-batches (the feed each run settled on is read from its
   ``config.yaml``). The sub-batch stays the same size, so that only the dataset grows.
   Then the same batch-64 runs with ``data.cache: disk``, each into a fresh cache folder, so its peak covers
   building the cache (one decoded image per file) and an epoch read from it.
   Target: the larger folder costs less than 100 MiB more (16,000 images as float32 would take about 790 MiB).
2. npz: an MLP (hidden [64]) for one epoch at batch 256 on 60,000 random 28x28 images with labels 0..9, stored as
   uint8 and as float32 (the same values / 255). Target: uint8 at least 100 MiB below float32.
3. speed: the same darknet_cnn for 3 epochs at batch 64 in 4 sub-batches on the 2,000-image folder, streamed, and
   on the same images decoded once into a uint8 npz (labels the sorted subfolder index, as the folder's), so both
   runs train the same samples in the same order. samples/s is the median of the epochs after the first, which
   traces the step. Target: streamed >= 0.9x in memory. Then the folder with ``data.cache: disk`` (the cache
   that the memory section's 2,000-image run built, so it starts warm) and ``data.cache: memory``.
   Target: ``cache: disk`` >= 0.9x in memory. Where the time goes: the read-only throughput of
   ``accumrun.data.feeder.Feeder`` over the folder's split, decoding the files and reading the disk cache (one
   epoch each, no training), and the in-memory run's samples/s, which is the step's own cost.

The data is made once, from seed 0, and cached under ``--data-dir``. The Markdown report (targets last) goes to
stdout, progress to stderr, every figure to the JSON ``--output``. Run from anywhere:

    python benchmarks/streaming.py [--quick] [--data-dir DIR] [--output PATH] [--epochs N] [--timeout S]

``--quick`` shrinks the data (500 and 4,000 images, 12,000 arrays, 500 images for speed) and trains 1 epoch: a
smoke run of the harness, whose numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is first on sys.path: run.py's description of the machine is shared.
from run import _accumrun_revision, machine

REPO = Path(__file__).resolve().parent.parent
IMAGE_SIZE = 64
CNN = {"name": "darknet_cnn", "filters": [16, 32], "strides": [2, 2]}
MLP = {"name": "mlp", "hidden": [64]}
BATCH, SUBDIVISIONS = 64, 4
FULL_BATCH_SUB_BATCH = 64
NPZ_SHAPE, NPZ_CLASSES, NPZ_BATCH = (28, 28), 10, 256
MAX_GROWTH_MIB = 100
MIN_UINT8_SAVING_MIB = 100
MIN_STREAMED_RATIO = 0.9
# Lines of a failed child's output kept for the report: enough for a Python traceback.
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class Sizes:
    """How much data each section uses; the speed section trains on the smaller image folder."""

    small_images: int
    large_images: int
    npz_samples: int
    epochs: int


FULL = Sizes(small_images=2_000, large_images=16_000, npz_samples=60_000, epochs=3)
# Small enough to finish in well under two minutes on 2 cores, most of it the children importing TensorFlow.
QUICK = Sizes(small_images=500, large_images=4_000, npz_samples=12_000, epochs=1)


def image_folder(data_dir: Path, count: int) -> Path:
    return data_dir / f"images-{count}-{IMAGE_SIZE}px-seed0"


def decoded_npz(data_dir: Path, count: int) -> Path:
    return data_dir / f"images-{count}-{IMAGE_SIZE}px-seed0.npz"


def random_npz(data_dir: Path, count: int, dtype: str) -> Path:
    return data_dir / f"random-{count}-{NPZ_SHAPE[0]}x{NPZ_SHAPE[1]}-{dtype}-seed0.npz"


def image_config(
    folder: Path, batch_size: int | str, subdivisions: int, epochs: int, cache: Path | None = None
) -> dict[str, Any]:
    """A run on the image folder; with ``cache``, through ``data.cache: disk`` in that folder."""
    data = {"name": "image_folder", "path": str(folder), "image_size": [IMAGE_SIZE, IMAGE_SIZE]}
    if cache is not None:
        data |= {"cache": "disk", "cache_dir": str(cache)}
    return _config({**data, "validation_split": 0}, CNN, batch_size, subdivisions, epochs)


def npz_config(path: Path, model: dict[str, Any], batch_size: int, subdivisions: int, epochs: int) -> dict[str, Any]:
    return _config({"name": "npz", "path": str(path), "validation_split": 0}, model, batch_size, subdivisions, epochs)


def _config(
    data: dict[str, Any], model: dict[str, Any], batch_size: int | str, subdivisions: int, epochs: int
) -> dict[str, Any]:
    return {
        "seed": 0,
        "data": data,
        "model": model,
        "training": {"epochs": epochs, "batch_size": batch_size, "subdivisions": subdivisions},
        # TensorBoard's writer is not what is measured, and it would add its own memory and time.
        "output": {"tensorboard": False},
    }


@dataclass
class Run:
    """One child process: what it ran and what was measured."""

    name: str
    section: str
    data: str
    batch_size: int | str | None = None
    subdivisions: int | None = None
    epochs: int | None = None
    status: str = "ok"
    error: str | None = None
    log_tail: str | None = None
    peak_rss_mib: float | None = None
    epoch_samples_per_second: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    samples_per_second: float | None = None
    final_loss: float | None = None
    feed: str | None = None
    wall_seconds: float = 0.0


@dataclass(frozen=True)
class Job:
    """A run to make: its record (filled in as it finishes) and the task its child does."""

    run: Run
    task: dict[str, Any]


def plan(sizes: Sizes, data_dir: Path, work_dir: Path) -> list[Job]:
    """Every run, in the order they are made."""
    jobs = []
    for label, batch in (("b64", BATCH), ("full", "full")):
        for count in (sizes.small_images, sizes.large_images):
            # A full batch keeps its sub-batches at 64 images: memory must follow the sub-batch, not the dataset.
            subdivisions = SUBDIVISIONS if batch == BATCH else -(-count // FULL_BATCH_SUB_BATCH)
            # One epoch: peak memory is reached within it, and a full batch is one update per epoch anyway.
            config = image_config(image_folder(data_dir, count), batch, subdivisions, epochs=1)
            run = Run(f"memory-{label}-{count}", "memory", f"image folder, {count:,} PNGs", batch, subdivisions, 1)
            jobs.append(_train_job(run, config, work_dir))
    for count in (sizes.small_images, sizes.large_images):
        # A cache folder of its own per run: each builds its cache, so its peak covers the build too.
        config = image_config(image_folder(data_dir, count), BATCH, SUBDIVISIONS, 1, work_dir / f"cache-{count}")
        data = f"image folder, {count:,} PNGs, cache: disk"
        run = Run(f"memory-disk-{count}", "memory", data, BATCH, SUBDIVISIONS, 1)
        jobs.append(_train_job(run, config, work_dir))
    for dtype in ("uint8", "float32"):
        config = npz_config(random_npz(data_dir, sizes.npz_samples, dtype), MLP, NPZ_BATCH, 1, epochs=1)
        run = Run(f"npz-{dtype}", "npz", f"npz, {sizes.npz_samples:,} x 28x28 {dtype}", NPZ_BATCH, 1, 1)
        jobs.append(_train_job(run, config, work_dir))
    count, epochs = sizes.small_images, sizes.epochs
    folder = image_folder(data_dir, count)
    streamed = image_config(folder, BATCH, SUBDIVISIONS, epochs)
    in_memory = npz_config(decoded_npz(data_dir, count), CNN, BATCH, SUBDIVISIONS, epochs)
    # The cache that memory-disk-{count} built: this run starts warm, as a second run over the folder does.
    cache = work_dir / f"cache-{count}"
    disk = image_config(folder, BATCH, SUBDIVISIONS, epochs, cache)
    memory = image_config(folder, BATCH, SUBDIVISIONS, epochs)
    memory["data"]["cache"] = "memory"
    for name, data, config in (
        ("speed-streamed", f"image folder, {count:,} PNGs", streamed),
        ("speed-in-memory", f"npz, the same {count:,} images as uint8", in_memory),
        ("speed-cache-disk", f"image folder, {count:,} PNGs, cache: disk (warm)", disk),
        ("speed-cache-memory", f"image folder, {count:,} PNGs, cache: memory", memory),
    ):
        jobs.append(_train_job(Run(name, "speed", data, BATCH, SUBDIVISIONS, epochs), config, work_dir))
    decode = Run("speed-decode-only", "speed", f"image folder, {count:,} PNGs, Feeder alone", BATCH, None, epochs)
    jobs.append(Job(decode, {"kind": "decode", "path": str(folder), "epochs": epochs}))
    read = Run("speed-cache-read-only", "speed", f"cache: disk of {count:,} PNGs, Feeder alone", BATCH, None, epochs)
    jobs.append(Job(read, {"kind": "decode", "path": str(folder), "epochs": epochs, "cache_dir": str(cache)}))
    return jobs


def _train_job(run: Run, config: dict[str, Any], work_dir: Path) -> Job:
    return Job(run, {"kind": "train", "config": config, "run_dir": str(work_dir / f"{run.name}.run")})


def data_tasks(sizes: Sizes, data_dir: Path) -> list[dict[str, Any]]:
    """What the runs read and the cache does not hold yet, in an order that makes each input before its use."""
    items: list[dict[str, Any]] = []
    for count in sorted({sizes.small_images, sizes.large_images}):
        items.append({"kind": "images", "path": str(image_folder(data_dir, count)), "count": count})
    for dtype in ("uint8", "float32"):
        path = random_npz(data_dir, sizes.npz_samples, dtype)
        items.append({"kind": "random_npz", "path": str(path), "count": sizes.npz_samples, "dtype": dtype})
    folder = image_folder(data_dir, sizes.small_images)
    items.append({"kind": "decoded_npz", "path": str(decoded_npz(data_dir, sizes.small_images)), "folder": str(folder)})
    return [item for item in items if not Path(item["path"]).exists()]


def run_child(name: str, task: dict[str, Any], work_dir: Path, timeout: float) -> tuple[dict[str, Any], float]:
    """Do ``task`` in a fresh process; returns what it reported and its wall time.

    Raises:
        ChildFailed: it exited non-zero or ran past ``timeout``; the error carries the end of its output.
    """
    result, log = work_dir / f"{name}.json", work_dir / f"{name}.log"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # The children import this checkout's accumrun, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps({**task, "result": str(result)})]
    started = time.perf_counter()
    # Output goes to a file: an unread pipe could fill up and stall the child.
    with log.open("w") as output:
        try:
            code = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.perf_counter() - started
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    tail = "\n".join(lines[-LOG_TAIL_LINES:])
    if code is None:
        raise ChildFailed(f"timed out after {timeout:.0f} s", tail, seconds)
    if code != 0:
        raise ChildFailed(lines[-1].strip() if lines else f"exit {code}", tail, seconds)
    return json.loads(result.read_text()), seconds


class ChildFailed(Exception):
    """A child process failed: why, in one line, and the end of its output (a traceback, as a rule)."""

    def __init__(self, reason: str, tail: str, seconds: float) -> None:
        super().__init__(reason)
        self.reason, self.tail, self.seconds = reason, tail, seconds


def measure(job: Job, work_dir: Path, timeout: float) -> Run:
    """Run ``job``'s child and fill in its record."""
    run = job.run
    try:
        report, run.wall_seconds = run_child(run.name, job.task, work_dir, timeout)
    except ChildFailed as failure:
        run.status, run.error, run.log_tail, run.wall_seconds = "failed", failure.reason, failure.tail, failure.seconds
        return run
    run.peak_rss_mib = report["peak_rss_mib"]
    if job.task["kind"] == "decode":
        run.epoch_samples_per_second = report["epoch_samples_per_second"]
        run.samples_per_second = report["samples_per_second"]
        return run
    rows = report["metrics"]
    run.epoch_samples_per_second = [float(row["samples_per_second"]) for row in rows]
    run.epoch_seconds = [float(row["seconds"]) for row in rows]
    run.final_loss, run.feed = float(rows[-1]["loss"]), report["feed"]
    # The first epoch traces the step; it measures that, not training. A 1-epoch (quick) run has only that one.
    timed = run.epoch_samples_per_second[1:] or run.epoch_samples_per_second
    run.samples_per_second = statistics.median(timed)
    return run


# The children: each does one task, then writes what it measured, its peak RSS included, to task["result"].


def child_main(task: dict[str, Any]) -> None:
    kind = task["kind"]
    report = {"prepare": _prepare, "train": _train, "decode": _decode}[kind](task)
    # Read last, so it covers everything the task did. Linux reports ru_maxrss in KiB.
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # default=float: a metrics value may be a NumPy scalar.
    Path(task["result"]).write_text(json.dumps(report, default=float))


def _train(task: dict[str, Any]) -> dict[str, Any]:
    import yaml

    import accumrun

    result = accumrun.train(task["config"], task["run_dir"], quiet=True)
    # config.yaml records what the run settled on, data.feed included, where the config said auto.
    saved = yaml.safe_load((Path(task["run_dir"]) / "config.yaml").read_text())
    return {"metrics": result.metrics, "feed": saved["data"]["feed"]}


def _decode(task: dict[str, Any]) -> dict[str, Any]:
    from accumrun.config.schema import data_config
    from accumrun.data.dataset import load_dataset
    from accumrun.data.feeder import Feeder

    config = data_config(
        name="image_folder", path=task["path"], image_size=[IMAGE_SIZE, IMAGE_SIZE], validation_split=0
    )
    if "cache_dir" in task:  # the training runs' disk cache, found by the same key
        config = config.model_copy(update={"cache": "disk", "cache_dir": task["cache_dir"]})
    split = load_dataset(config, seed=0).train
    full, rest = divmod(split.size, BATCH)
    # The chunks a batch-64 run without subdivided feeding asks for: whole batches, then the remainder.
    feeder = Feeder(split, [BATCH] * full + ([rest] if rest else []), seed=0, shuffle=True)
    # As the training runs are timed: the median of the epochs after the first, which builds the pipeline.
    rates = []
    for epoch in range(task["epochs"]):
        samples, started = 0, time.perf_counter()
        for x, _ in feeder.epoch(epoch):
            samples += int(x.shape[0])
        rates.append(samples / (time.perf_counter() - started))
    steady = rates[1:] or rates
    return {"samples_per_second": statistics.median(steady), "epoch_samples_per_second": rates}


def _prepare(task: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from accumrun.data.examples import write_image_folder

    for item in task["items"]:
        target = Path(item["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        # Written beside the target, then renamed: an interrupted run leaves no half-made input in the cache.
        partial = target.with_name(target.name + ".partial")
        if partial.is_dir():
            shutil.rmtree(partial)
        if item["kind"] == "images":
            write_image_folder(partial, item["count"], size=IMAGE_SIZE, seed=0)
        else:
            if item["kind"] == "random_npz":
                x, y = _random_arrays(item["count"], item["dtype"])
            else:
                x, y = _decode_folder(Path(item["folder"]))
            # A file object, so that numpy does not append ".npz" to the partial name.
            with partial.open("wb") as file:
                np.savez(file, x=x, y=y)
        partial.rename(target)
    return {"made": [item["path"] for item in task["items"]]}


def _random_arrays(count: int, dtype: str) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(count, *NPZ_SHAPE), dtype=np.uint8)
    y = rng.integers(0, NPZ_CLASSES, size=count).astype(np.int32)
    # The same draws either way: the float32 file holds the uint8 file's values / 255, what rescale: auto makes of it.
    return (x, y) if dtype == "uint8" else (x.astype(np.float32) / 255, y)


def _decode_folder(folder: Path) -> tuple[Any, Any]:
    """The folder's images as one uint8 array, in the order accumrun lists them: by class (the sorted subfolder
    names, whose index is the label), then by path."""
    import numpy as np
    import tensorflow as tf

    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    images, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted((folder / name).glob("*.png")):
            images.append(tf.io.decode_png(file.read_bytes(), channels=3).numpy())
            labels.append(label)
    return np.stack(images), np.array(labels, dtype=np.int32)


# The report.


@dataclass
class Target:
    """One goal, its measured value and whether it was met."""

    target: str
    measured: str
    met: bool


def _by_name(runs: list[Run]) -> dict[str, Run]:
    return {run.name: run for run in runs}


def figures(runs: list[Run], sizes: Sizes) -> dict[str, Any]:
    """The derived figures: growths and savings of peak RSS, the speed ratio, and the cost per sample of each part."""
    found = _by_name(runs)
    out: dict[str, Any] = {}

    def rss(name: str) -> float | None:
        run = found.get(name)
        return run.peak_rss_mib if run and run.status == "ok" else None

    for label in ("b64", "full", "disk"):
        small, large = rss(f"memory-{label}-{sizes.small_images}"), rss(f"memory-{label}-{sizes.large_images}")
        out[f"memory_{label}_growth_mib"] = None if None in (small, large) else large - small
    uint8, float32 = rss("npz-uint8"), rss("npz-float32")
    out["npz_uint8_saving_mib"] = None if None in (uint8, float32) else float32 - uint8
    rates = {}
    for part in ("streamed", "in-memory", "decode-only", "cache-disk", "cache-memory", "cache-read-only"):
        run = found.get(f"speed-{part}")
        rates[part] = run.samples_per_second if run and run.status == "ok" else None
        out[f"{part.replace('-', '_')}_samples_per_second"] = rates[part]
    for part in ("streamed", "cache-disk", "cache-memory"):
        ratio = None if None in (rates[part], rates["in-memory"]) else rates[part] / rates["in-memory"]
        out[f"{part.replace('-', '_')}_over_in_memory"] = ratio
    # Microseconds per sample: if streaming were free, streamed would equal the step; if decoding did not overlap
    # the step at all, streamed would be about step + decode.
    for part, rate in rates.items():
        out[f"{part.replace('-', '_')}_us_per_sample"] = None if rate is None else 1e6 / rate
    return out


def evaluate_targets(runs: list[Run], sizes: Sizes, figs: dict[str, Any]) -> list[Target]:
    found = _by_name(runs)
    targets = []
    for label, what in (
        ("b64", f"batch {BATCH}, S={SUBDIVISIONS}"),
        ("full", f"full batch in sub-batches of {FULL_BATCH_SUB_BATCH}"),
        ("disk", f"cache: disk (built in the run), batch {BATCH}, S={SUBDIVISIONS}"),
    ):
        growth = figs[f"memory_{label}_growth_mib"]
        goal = (
            f"image folder, {what}: peak RSS at {sizes.large_images:,} images - at {sizes.small_images:,} "
            f"< {MAX_GROWTH_MIB} MiB"
        )
        if growth is None:
            targets.append(Target(goal, "not measured: a run failed", False))
            continue
        small, large = found[f"memory-{label}-{sizes.small_images}"], found[f"memory-{label}-{sizes.large_images}"]
        measured = f"{growth:+,.0f} MiB ({small.peak_rss_mib:,.0f} -> {large.peak_rss_mib:,.0f})"
        if label == "full":
            measured += f"; feed {small.feed} / {large.feed}"
        targets.append(Target(goal, measured, growth < MAX_GROWTH_MIB))
    saving = figs["npz_uint8_saving_mib"]
    goal = f"npz, {sizes.npz_samples:,} x 28x28: peak RSS of uint8 <= float32 - {MIN_UINT8_SAVING_MIB} MiB"
    if saving is None:
        targets.append(Target(goal, "not measured: a run failed", False))
    else:
        uint8, float32 = found["npz-uint8"], found["npz-float32"]
        measured = f"{saving:,.0f} MiB below ({uint8.peak_rss_mib:,.0f} vs {float32.peak_rss_mib:,.0f})"
        targets.append(Target(goal, measured, saving >= MIN_UINT8_SAVING_MIB))
    for part, what in (("streamed", "streamed"), ("cache_disk", "cache: disk (warm)")):
        ratio = figs[f"{part}_over_in_memory"]
        goal = f"darknet_cnn on {sizes.small_images:,} images: {what} samples/s >= {MIN_STREAMED_RATIO:g}x in memory"
        if ratio is None:
            targets.append(Target(goal, "not measured: a run failed", False))
            continue
        rate, in_memory = figs[f"{part}_samples_per_second"], figs["in_memory_samples_per_second"]
        measured = f"{ratio:.2f}x ({rate:,.0f} / {in_memory:,.0f})"
        targets.append(Target(goal, measured, ratio >= MIN_STREAMED_RATIO))
    return targets


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_markdown(report: dict[str, Any], runs: list[Run], targets: list[Target]) -> str:
    info, figs = report["machine"], report["figures"]
    lines = [
        "# Benchmarks: data streaming",
        "",
        f"Written by `benchmarks/streaming.py`; every figure, each epoch's included, is in `{report['output']}`.",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores; load average {info['load_average_at_start']} at the "
        f"start, {info['load_average_at_end']} at the end",
        f"- TensorFlow {info['tensorflow']}, Keras {info['keras']}, Python {info['python']}; {info['date']}",
        f"- accumrun at {_revisions(info)}; command: `{report['command']}`",
        f"- total wall time {report['total_seconds']:.0f} s",
        "",
    ]
    if report["quick"]:
        lines += ["**Quick run**: small data, 1 epoch. It checks the harness; its numbers mean nothing.", ""]
    lines += [
        "Each row is a fresh process; peak RSS is its `ru_maxrss` (TensorFlow included). samples/s is the median",
        "over the epochs after the first (the only epoch, when there is one).",
        "",
        "| run | data | batch | S | epochs | feed | peak RSS MiB | samples/s | final loss |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for run in runs:
        head = f"| {run.name} | {run.data} | {run.batch_size} | {run.subdivisions or '-'} | {run.epochs} |"
        if run.status != "ok":
            lines.append(f"{head} - | failed: {_cell(run.error or '')} | - | - |")
            continue
        loss = "-" if run.final_loss is None else f"{run.final_loss:.4f}"
        rates = f"{run.peak_rss_mib:,.0f} | {run.samples_per_second:,.0f} | {loss} |"
        lines.append(f"{head} {run.feed or '-'} | {rates}")
    lines += [
        "",
        "## Where the time goes (speed section)",
        "",
        "| part | samples/s | µs per sample |",
        "| --- | ---: | ---: |",
        f"| decode only (`Feeder` over the folder, no training) | {_number(figs['decode_only_samples_per_second'])} "
        f"| {_number(figs['decode_only_us_per_sample'], 1)} |",
        f"| cache read only (`Feeder` over the disk cache, no training) "
        f"| {_number(figs['cache_read_only_samples_per_second'])} "
        f"| {_number(figs['cache_read_only_us_per_sample'], 1)} |",
        f"| step (the in-memory run) | {_number(figs['in_memory_samples_per_second'])} "
        f"| {_number(figs['in_memory_us_per_sample'], 1)} |",
        f"| streamed training | {_number(figs['streamed_samples_per_second'])} "
        f"| {_number(figs['streamed_us_per_sample'], 1)} |",
        f"| training with cache: disk (warm) | {_number(figs['cache_disk_samples_per_second'])} "
        f"| {_number(figs['cache_disk_us_per_sample'], 1)} |",
        f"| training with cache: memory | {_number(figs['cache_memory_samples_per_second'])} "
        f"| {_number(figs['cache_memory_us_per_sample'], 1)} |",
        "",
        "With decoding fully overlapped, streamed costs what the step costs; with none, about step + decode.",
        "",
        "## Targets",
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {t.target} | {t.measured} | {'met' if t.met else 'NOT met'} |" for t in targets]
    return "\n".join(lines) + "\n"


def _revisions(info: dict[str, Any]) -> str:
    start, end = info["accumrun_revision"], info["accumrun_revision_at_end"]
    return start if start == end else f"{start} at the start, {end} at the end"


def _progress(index: int, count: int, run: Run) -> str:
    head = f"[{index:>2}/{count}] {run.name:<22}"
    if run.status != "ok":
        return f"{head} failed: {run.error} ({run.wall_seconds:.1f} s)"
    feed = f" feed {run.feed}" if run.feed else ""
    return (
        f"{head} {run.samples_per_second:>9,.0f} samples/s {run.peak_rss_mib:>7,.0f} MiB RSS"
        f"{feed} {run.wall_seconds:>6.1f} s"
    )


def main() -> None:
    """Make the data the cache lacks, make every run one after another, then report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data and 1 epoch, to check the harness")
    parser.add_argument("--data-dir", type=Path, default=REPO / "benchmarks" / ".data", help="cache of the inputs")
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs" / "benchmarks-streaming.md", help="markdown to write (JSON beside)"
    )
    parser.add_argument("--epochs", type=int, help="epochs of the speed runs (default 3; 1 with --quick)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed (default 1800)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_main(json.loads(args.child))
        return
    sizes = QUICK if args.quick else FULL
    if args.epochs is not None:
        if args.epochs < 1:
            parser.error("--epochs must be at least 1")
        sizes = Sizes(sizes.small_images, sizes.large_images, sizes.npz_samples, args.epochs)
    data_dir = args.data_dir.resolve()
    started = time.perf_counter()
    report: dict[str, Any] = {"machine": machine(), "command": shlex.join([sys.executable, *sys.argv])}
    runs = []
    with tempfile.TemporaryDirectory(prefix="accumrun-streaming-") as temporary:
        work_dir = Path(temporary)
        missing = data_tasks(sizes, data_dir)
        if missing:
            print(f"making {len(missing)} inputs under {data_dir} ...", file=sys.stderr, flush=True)
            try:
                _, seconds = run_child("prepare", {"kind": "prepare", "items": missing}, work_dir, args.timeout)
            except ChildFailed as failure:
                sys.exit(f"making the data failed: {failure.reason}\n{failure.tail}")
            print(f"made them in {seconds:.0f} s", file=sys.stderr, flush=True)
        jobs = plan(sizes, data_dir, work_dir)
        for index, job in enumerate(jobs, 1):
            runs.append(measure(job, work_dir, args.timeout))
            print(_progress(index, len(jobs), runs[-1]), file=sys.stderr, flush=True)
    report["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    # accumrun may be edited while a long run goes on; then the runs measured different code.
    report["machine"]["accumrun_revision_at_end"] = _accumrun_revision()
    figs = figures(runs, sizes)
    targets = evaluate_targets(runs, sizes, figs)
    report.update(
        quick=args.quick,
        sizes=asdict(sizes),
        output=args.out.with_suffix(".json").name,
        total_seconds=time.perf_counter() - started,
        figures=figs,
        targets=[asdict(t) for t in targets],
        runs=[asdict(r) for r in runs],
    )
    markdown = render_markdown(report, runs, targets)
    print(markdown)
    for run in runs:
        if run.status != "ok":
            print(f"--- {run.name} failed; the end of its output:\n{run.log_tail}", file=sys.stderr)
    json_path = args.out.with_suffix(".json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown + "\n")
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"total wall time {report['total_seconds']:.0f} s; wrote {args.out} and {json_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
