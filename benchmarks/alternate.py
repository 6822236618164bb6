"""Time accumrun at two commits on ``benchmarks/run.py``'s workloads (and ``full_batch.py``'s case, as ``full_batch``),
alternating, so both see the same machine.

A code change's few percent drown in what a loaded machine does to one run after another (the peers of one
``run.py`` moved by 2x between two of its runs), so the two codes run in turns: A B B A A B ... , each run a
process of its own that trains with ``python -m accumrun train`` from that commit's checkout (a ``git worktree``
made here, removed at the end). Each run's figure is ``run.py``'s: the median samples/s of its epochs after the
first. The report gives every run's figure, each code's median, and the change of the second against the first::

    python benchmarks/alternate.py OLD_COMMIT [NEW_COMMIT] [--runs 5] [--workloads dispatch,compute,applications]
        [--new-set KEY=VALUE ...] [--out docs/benchmarks-alternate.md]

NEW_COMMIT defaults to this checkout as it is (uncommitted changes included). ``--new-set`` sets a config key in
the second code's runs alone, so one code can be timed with and without a feature:
``python benchmarks/alternate.py HEAD --new-set 'training.measure=[noise_scale]'``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run import REPO, Workload, machine, measure, publish_report, workloads  # benchmarks/run.py, beside this script

SLOWER_LIMIT = 0.05
"""The issue's bound: no workload more than 5% slower on the new code."""

FULL_BATCH = Workload("full_batch", {"name": "mlp", "hidden": [64, 64]}, 2000, 2000, 4, shape=(32,))
"""``full_batch.py``'s case beside ``run.py``'s workloads: 2,000 samples of 32 features, an MLP [64, 64], the whole
set as one batch in 4 sub-batches. An epoch is one update of a few milliseconds, so its runs train
:data:`FULL_BATCH_EPOCHS` times ``--epochs``."""

FULL_BATCH_EPOCHS = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the commit to compare against")
    parser.add_argument("new", nargs="?", help="the commit to compare (default: this checkout as it is)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each code per workload (default 5)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run, at least 2 (default 4)")
    parser.add_argument(
        "--workloads", default="dispatch,compute,applications", help="run.py's workloads or full_batch, by name"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a run is killed (default 600)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-alternate.md", help="markdown to write")
    parser.add_argument(
        "--new-set", action="append", default=[], metavar="KEY=VALUE", help="a config key for the second code's runs"
    )
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is left out of the throughput")
    chosen = [w for w in [*workloads(smoke=False), FULL_BATCH] if w.name in args.workloads.split(",")]
    if not chosen:
        parser.error(f"--workloads: none of {args.workloads!r} is a workload of run.py or full_batch")
    info, started = machine(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="accumrun-alternate-") as scratch:
        work = Path(scratch)
        codes = {_short(args.old): _checkout(args.old, work / "old")}
        if args.new:
            codes[_short(args.new)] = _checkout(args.new, work / "new")
        else:  # named as machine() names it: its commit, "+changes" where accumrun/ differs from it
            codes[info["accumrun_revision"]] = REPO
        if args.new_set:
            # The second code under its settings: a name of its own, even where both codes are one commit.
            new_name, new_path = list(codes.items())[-1]
            codes[f"{new_name} with {' '.join(args.new_set)}"] = new_path
            if len(codes) == 3:
                del codes[new_name]
        try:
            figures = {w.name: _alternate(w, codes, args, work) for w in chosen}
        finally:
            for name in ("old", "new"):
                if (work / name).exists():
                    subprocess.run(
                        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / name)], check=False
                    )
    info["load_average_at_end"] = round(os.getloadavg()[0], 2)
    minutes = (time.perf_counter() - started) / 60
    publish_report(
        args.out,
        title="Two codes alternating",
        command=shlex.join(["python", "benchmarks/alternate.py", *sys.argv[1:]]),
        info=info,
        figures={"codes": list(codes), "epochs": args.epochs, "runs": args.runs, "samples_per_second": figures},
        body=_table(chosen, figures, list(codes), args, minutes),
    )


def _checkout(commit: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(into), commit], check=True)
    return into


def _short(commit: str) -> str:
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", commit], capture_output=True, text=True)
    return found.stdout.strip() or commit


def _alternate(
    workload: Workload, codes: dict[str, Path], args: argparse.Namespace, work: Path
) -> dict[str, list[float | None]]:
    """Each code's figures on ``workload``, run in the order A B B A A B ... (``args.runs`` of each)."""
    names = list(codes)
    figures: dict[str, list[float | None]] = {name: [] for name in names}
    for turn in range(args.runs):
        for name in names if turn % 2 == 0 else names[::-1]:
            folder = work / f"{workload.name}-{len(figures[name])}-{names.index(name)}"
            folder.mkdir()
            overrides = tuple(args.new_set) if name == names[-1] else ()
            epochs = args.epochs * (FULL_BATCH_EPOCHS if workload is FULL_BATCH else 1)
            result = measure(workload, "accumrun", epochs, folder, args.timeout, codes[name], overrides)
            figures[name].append(result.samples_per_second)
            shown = f"{result.samples_per_second:,.0f} samples/s" if result.samples_per_second else result.error
            print(f"{workload.name} {name} run {turn + 1}: {shown}", file=sys.stderr, flush=True)
    return figures


def _table(
    chosen: list[Workload],
    figures: dict[str, dict[str, list[float | None]]],
    names: list[str],
    args: argparse.Namespace,
    minutes: float,
) -> list[str]:
    old, new = names
    full_batch = f" ({args.epochs * FULL_BATCH_EPOCHS} for full_batch)" if FULL_BATCH in chosen else ""
    lines = [
        f"{args.runs} runs of each code per workload, {args.epochs} epochs each{full_batch}, {minutes:.0f} min in all. "
        "Samples/s, the median of each run's epochs after the first.",
        "",
        f"| workload | {old} (each run) | {new} (each run) | {old} median | {new} median | change | ≤5% slower |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for workload in chosen:
        runs = figures[workload.name]
        medians = [statistics.median([f for f in runs[name] if f is not None] or [0.0]) for name in names]
        change = medians[1] / medians[0] - 1 if medians[0] else float("nan")
        each = [", ".join(f"{f:,.0f}" if f is not None else "failed" for f in runs[name]) for name in names]
        verdict = "met" if change >= -SLOWER_LIMIT else "NOT met"
        label = f"{workload.name} (B={workload.batch_size}, S={workload.subdivisions})"
        lines.append(
            f"| {label} | {each[0]} | {each[1]} | {medians[0]:,.0f} | {medians[1]:,.0f} | {change:+.1%} | {verdict} |"
        )
    return lines


if __name__ == "__main__":
    main()
