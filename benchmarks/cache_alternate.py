"""``data.cache: disk`` against the same images in memory, alternating, so both see the same (shared) machine.

The runs are ``benchmarks/streaming.py``'s speed section (darknet_cnn, filters [16, 32], strides [2, 2], on its
folder of 64x64 PNGs, batch 64 in 4 sub-batches), each a process of its own, in turns: disk, memory, memory,
disk, ... . The disk cache is built before the first run, so every disk run starts warm, as a second run over the
folder does. Both run several updates per compiled call (``training.updates_per_call: auto``): memory from the
arrays held as one tensor, disk from each call's batches, read for it while the call before trains. ``memory-1``
and ``disk-1`` train at ``training.updates_per_call: 1``, one update per call, as the disk cache did before it
ran several: what the calls of several updates are worth on either side.

Each run reports two figures per epoch after the first: samples/s by the wall clock (the target's), and samples
per CPU second of the whole process (its user and system time, read as each epoch's row reaches
``metrics.jsonl``). On a machine that other work shares, the wall clock follows the others' load, while the CPU
seconds follow the work a sample costs: the two together tell a slower reader from a busier machine. A disk run
also reports the share of its training time that the step waited for reads (the reads not hidden behind the call
before). The report gives every run's figures, each arm's median, and the ratios of disk to memory. ``--reads``
measures the disk cache's reads alone instead (no training): CPU and wall time per sample, with the cache file's
pages dropped from the page cache (``posix_fadvise``, that file alone) and warm, in chunks of one batch and of eight.
Run from anywhere:

    python benchmarks/cache_alternate.py [--runs 3] [--epochs 4] [--images 2000] [--arms disk,memory,memory-1,disk-1]
        [--data-dir DIR] [--out PATH] [--reads]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is first on sys.path: the data and configs are streaming.py's.
from run import REPO, machine
from streaming import BATCH, SUBDIVISIONS, image_config, image_folder

ARMS = {
    "disk": {"data.cache": "disk"},
    "memory": {"data.cache": "memory"},
    "memory-1": {"data.cache": "memory", "training.updates_per_call": 1},
    "disk-1": {"data.cache": "disk", "training.updates_per_call": 1},
}
"""Each arm's keys over the speed section's config of the image folder."""
TARGET = 0.9


def config(arm: str, folder: Path, cache_dir: Path, epochs: int) -> dict[str, Any]:
    """The speed section's run on ``folder`` as ``arm`` sets it."""
    made = image_config(folder, BATCH, SUBDIVISIONS, epochs)
    for key, value in ARMS[arm].items():
        section, name = key.split(".")
        made[section][name] = value
    made["data"]["cache_dir"] = str(cache_dir)
    return made


def child(task: dict[str, Any]) -> None:
    """Train one run; write each epoch's samples/s by the wall clock and per CPU second, and the seconds the step
    waited for reads."""
    import accumrun
    from accumrun.data.feeder import Feeder

    if task.get("reads"):
        reads(task)
        return
    waited = [0.0]
    read = Feeder.read

    def timed_read(self: Feeder, chunks: list[tuple[int, int]], then: list[tuple[int, int]]) -> Any:
        started = time.perf_counter()
        try:
            return read(self, chunks, then)
        finally:
            waited[0] += time.perf_counter() - started

    Feeder.read = timed_read
    marks: list[float] = []
    with tempfile.TemporaryDirectory(prefix="accumrun-cache-") as scratch:
        metrics = Path(scratch) / "run" / "metrics.jsonl"
        finished = threading.Event()

        def watch() -> None:  # the process's CPU seconds as each epoch's row lands
            seen = 0
            while not finished.is_set():
                rows = len(metrics.read_text().splitlines()) if metrics.exists() else 0
                if rows > seen:
                    marks.append(time.process_time())
                    seen = rows
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = accumrun.train(task["config"], Path(scratch) / "run", quiet=True)
        time.sleep(0.1)
        finished.set()
        watcher.join()
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    wall = [float(row["samples_per_second"]) for row in rows]
    cpu = [task["images"] / (after - before) for before, after in zip(marks, marks[1:], strict=False)]
    trained = sum(float(row["seconds"]) for row in result.metrics)
    Path(task["result"]).write_text(json.dumps({"wall": wall[1:], "cpu": cpu, "read_wait": waited[0] / trained}))


def reads(task: dict[str, Any]) -> None:
    """The disk cache's reads alone, per sample: CPU and wall, cold and warm, in chunks of one batch and eight."""
    from accumrun import load_config
    from accumrun.data.dataset import load_dataset
    from accumrun.data.feeder import Feeder

    split: Any = load_dataset(load_config(task["config"]).data, seed=0).train
    lines = []
    for chunk in (BATCH, 8 * BATCH):
        sizes = [chunk] * (split.size // chunk) + ([split.size % chunk] if split.size % chunk else [])
        feeder = Feeder(split, sizes, seed=0, shuffle=True)
        for epoch, state in enumerate(("cold", "warm", "warm")):
            if state == "cold":
                descriptor = os.open(split.file, os.O_RDONLY)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(descriptor)
            cpu, wall = time.process_time(), time.perf_counter()
            for index in range(len(sizes)):
                feeder.read([(epoch, index)], [])
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            lines.append(f"| {chunk} | {state} | {cpu / split.size * 1e6:,.1f} | {wall / split.size * 1e6:,.1f} |")
    Path(task["result"]).write_text(json.dumps({"lines": lines}))


def run_one(task: dict[str, Any], work: Path, name: str) -> dict[str, Any]:
    result = work / f"{name}.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps({**task, "result": str(result)})]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each arm (default 3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run, at least 2 (default 4)")
    parser.add_argument("--images", type=int, default=2000, help="the folder's images (default 2000)")
    parser.add_argument("--arms", default="disk,memory,memory-1", help=f"of {', '.join(ARMS)}; disk first")
    parser.add_argument("--data-dir", type=Path, default=REPO / "benchmarks" / ".data", help="streaming.py's data")
    parser.add_argument("--out", type=Path, help="also write the report here (Markdown)")
    parser.add_argument("--reads", action="store_true", help="measure the disk cache's reads alone")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    arms = args.arms.split(",")
    folder = image_folder(args.data_dir, args.images)
    if not folder.is_dir():
        from accumrun.data.examples import write_image_folder

        write_image_folder(folder, args.images, size=64, seed=0)
    info = machine()
    figures: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    lines = []
    with tempfile.TemporaryDirectory(prefix="accumrun-cache-alternate-") as scratch:
        work = Path(scratch)
        warm = {"config": config("disk", folder, work / "cache", 1), "images": args.images}
        run_one(warm, work, "build")  # the disk cache, built once: every disk run below starts warm
        if args.reads:
            got = run_one({**warm, "reads": True}, work, "reads")
            header = ["| chunk | page cache | CPU us per sample | wall us per sample |", "| ---: | --- | ---: | ---: |"]
            print("\n".join(header + got["lines"]))
            return
        for turn in range(args.runs):
            for arm in arms if turn % 2 == 0 else arms[::-1]:
                task = {"config": config(arm, folder, work / "cache", args.epochs), "images": args.images}
                got = run_one(task, work, f"{arm}-{turn}")
                got["load"] = round(os.getloadavg()[0], 2)
                figures[arm].append(got)
                waits = f"{got['read_wait']:.1%}" if arm.startswith("disk") else "-"
                line = f"| {arm} | {turn} | {_rates(got['wall'])} | {_rates(got['cpu'])} | {waits} | {got['load']} |"
                lines.append(line)
                print(line, file=sys.stderr, flush=True)
    medians = {
        arm: {kind: statistics.median(statistics.median(run[kind]) for run in runs) for kind in ("wall", "cpu")}
        for arm, runs in figures.items()
    }
    report = [
        "# data.cache: disk against the same images in memory, alternating",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores, shared with other work: load average "
        f"{info['load_average_at_start']} at the start",
        f"- accumrun at {info['accumrun_revision']}; {info['date']}; `{' '.join(sys.argv)}`",
        "",
        "| arm | turn | samples/s (wall), epochs after the first | samples per CPU second | waited for reads | load |",
        "| --- | ---: | --- | --- | ---: | ---: |",
        *lines,
        "",
        "| arm | median samples/s (wall) | median samples per CPU second |",
        "| --- | ---: | ---: |",
        *(f"| {arm} | {m['wall']:,.0f} | {m['cpu']:,.0f} |" for arm, m in medians.items()),
        "",
    ]
    for other in arms[1:]:
        for kind, what in (("wall", "samples/s"), ("cpu", "samples per CPU second")):
            ratio = medians["disk"][kind] / medians[other][kind]
            met = " (target >= 0.9x)" if kind == "wall" and other == "memory" else ""
            report.append(f"- disk / {other}, {what}: {ratio:.2f}x{met}")
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"runs": figures, "medians": medians, "machine": info}))


def _rates(values: list[float]) -> str:
    return ", ".join(f"{value:,.0f}" for value in values)


if __name__ == "__main__":
    main()
