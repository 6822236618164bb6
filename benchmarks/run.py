"""Benchmark accumrun against its peers and write ``docs/benchmarks.md`` (and the raw ``docs/benchmarks.json``).

Every method trains the same data and model from the same seed in a process of its own, started one after
another. Throughput is the median samples/s of the epochs after the first (tracing) one; peak memory is the
child's peak resident set size, read by this process from the child's rusage, so accumrun and the peers are
measured the same way. Run from anywhere: ``python benchmarks/run.py [--smoke] [--epochs N] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib.metadata import version
from itertools import pairwise
from operator import attrgetter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
PEERS_SCRIPT = Path(__file__).with_name("peers.py")
METHODS = ("accumrun", "accumrun_xla", "keras_accum", "python_loop", "fit_sub", "fit_full")
MEMORY_METHODS = ("accumrun", "fit_sub")
XLA_OVERRIDE = "training.jit_compile=true"
# (workload, method, least accepted ratio of accumrun's samples/s to the method's)
THROUGHPUT_TARGETS = (("dispatch", "keras_accum", 4.0), ("dispatch", "fit_full", 0.5))
THROUGHPUT_TARGETS += (("compute", "keras_accum", 1.2), ("compute", "fit_full", 0.9))
THROUGHPUT_TARGETS += (("applications", "fit_full", 1.0),)
MEMORY_RSS_LIMIT = 1.1
# (workload, most accepted ratio of accumrun's peak RSS at batch B to fit_sub's at batch B/S), for the workloads
# outside the memory section, which checks every S of its own.
RSS_TARGETS = (("applications", MEMORY_RSS_LIMIT),)


@dataclass(frozen=True)
class Workload:
    """One training setup: synthetic data of samples of ``shape``, a model section, the batch and its
    subdivisions."""

    name: str
    model: dict[str, Any]
    samples: int
    batch_size: int
    subdivisions: int
    methods: tuple[str, ...] = METHODS
    shape: tuple[int, ...] = (28, 28, 1)

    def __post_init__(self) -> None:
        # Whole batches of whole sub-batches: every method then sees the same batch and sub-batch sizes.
        if self.samples % self.batch_size or self.batch_size % self.subdivisions:
            raise ValueError(f"{self.name}: samples, batch and sub-batch must divide evenly")

    @property
    def sub_batch(self) -> int:
        return self.batch_size // self.subdivisions

    def spec(self, epochs: int) -> dict[str, Any]:
        """The accumrun config of this workload, which is also what ``peers.py`` reads."""
        # A list: the config schema is strict, and YAML and JSON write lists.
        data = {"name": "synthetic", "samples": self.samples, "shape": list(self.shape), "classes": 10}
        return {
            "seed": 0,
            "data": {**data, "validation_split": 0.0},
            "model": self.model,
            "training": {"epochs": epochs, "batch_size": self.batch_size, "subdivisions": self.subdivisions},
            "optimizer": {"name": "adam", "learning_rate": 0.001},
        }


def workloads(smoke: bool) -> list[Workload]:
    """dispatch (many tiny sub-batches), compute (a CNN), applications (a ``keras.applications`` model on
    96x96x3 images) and memory (the CNN's whole set in 1 to 32 parts)."""
    if smoke:
        # Each run is a process that imports TensorFlow (6 to 10 s of CPU), so the smoke run is dispatch alone,
        # which runs every method through the same child code as every workload. The targets of the other
        # workloads are computed from given results in tests/test_benchmarks.py, without training.
        return [Workload("dispatch", {"name": "mlp", "hidden": [16]}, 256, 64, 4)]
    mlp = {"name": "mlp", "hidden": [256, 256]}
    cnn = {"name": "darknet_cnn", "filters": [32, 64, 96, 128, 160], "strides": [2, 2, 1, 1, 1]}
    # XLA's convolutions are far slower than TensorFlow's own on a CPU (about 30 samples/s against 800 here, by
    # hand): four epochs of accumrun_xla on the CNN alone would take longer than the whole benchmark.
    compute_methods = tuple(m for m in METHODS if m != "accumrun_xla")
    # Random weights (weights: None), so the run downloads nothing. The issue asks for accumrun against Keras'
    # accumulation and plain fit at B and B/S only. accumrun_xla is left out for XLA's convolutions (as above)
    # and python_loop for time: MobileNetV2 at 96x96 is about 3x the CNN's multiply-adds per sample (55 M against
    # 18 M), many in depthwise convolutions that are slow on a CPU, and compute already compares with that loop.
    mobilenet = {"name": "keras.applications.MobileNetV2", "alpha": 1.0, "weights": None}
    app_methods = ("accumrun", "keras_accum", "fit_sub", "fit_full")
    found = [
        Workload("dispatch", mlp, 16_384, 1024, 128),
        Workload("compute", cnn, 2048, 1024, 16, compute_methods),
        Workload("applications", mobilenet, 1024, 256, 8, app_methods, shape=(96, 96, 3)),
    ]
    return found + [Workload("memory", cnn, 2048, 2048, s, MEMORY_METHODS) for s in (1, 2, 4, 8, 16, 32)]


@dataclass
class Result:
    """One child process: what it ran and what was measured."""

    workload: str
    method: str
    batch_size: int
    subdivisions: int
    status: str = "ok"
    error: str | None = None
    epoch_samples_per_second: list[float] = field(default_factory=list)
    samples_per_second: float | None = None
    peak_rss_mib: float | None = None
    wall_seconds: float = 0.0
    jit_compile: bool | None = None


def run_child(command: list[str], log: Path, timeout: float, repo: Path = REPO) -> tuple[int | None, float, float]:
    """Run ``command`` in ``repo`` to its end; returns ``(exit code or None if killed on timeout, peak RSS MiB,
    seconds)``."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # The children import the checkout's accumrun, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    # Output goes to a file: an unread pipe could fill up and stall the child.
    with log.open("w") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=repo)
    timed_out = False
    # Polled with WNOHANG rather than a timer thread calling kill(): Popen.kill() polls, and that could reap the
    # child first and lose its rusage. Only this loop reaps it, so the rusage is always the child's own.
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - started > timeout:
            child.kill()
            timed_out = True
            _, status, usage = os.wait4(child.pid, 0)
            break
        time.sleep(0.05)
    # Tell Popen the child is reaped; otherwise it would try to wait for that pid again later.
    child.returncode = os.waitstatus_to_exitcode(status)
    # Linux reports ru_maxrss in KiB.
    return None if timed_out else child.returncode, usage.ru_maxrss / 1024, time.perf_counter() - started


def measure(
    workload: Workload,
    method: str,
    epochs: int,
    work_dir: Path,
    timeout: float,
    repo: Path = REPO,
    overrides: tuple[str, ...] = (),
) -> Result:
    """Train ``workload`` with ``method`` in a child process (accumrun from the checkout ``repo``, with the config
    ``overrides``, each ``KEY=VALUE`` as ``--set`` takes it) and collect its throughput and peak memory."""
    result = Result(workload.name, method, workload.batch_size, workload.subdivisions)
    stem = work_dir / f"{workload.name}-s{workload.subdivisions}-{method}"
    spec = workload.spec(epochs)
    if method.startswith("accumrun"):
        config = stem.with_suffix(".yaml")
        config.write_text(yaml.safe_dump(spec, sort_keys=False))
        run_dir = stem.with_suffix(".run")
        command = [sys.executable, "-m", "accumrun", "train", str(config), "--run-dir", str(run_dir)]
        command += ["-q", "--no-tensorboard"] + (["--set", XLA_OVERRIDE] if method == "accumrun_xla" else [])
        command += [argument for override in overrides for argument in ("--set", override)]
        result.jit_compile = method == "accumrun_xla"
    else:
        sizes = {"batch_size": workload.batch_size, "subdivisions": workload.subdivisions, "epochs": epochs}
        peer_spec = {"data": spec["data"], "model": spec["model"], **sizes}
        command = [sys.executable, str(PEERS_SCRIPT), method, json.dumps(peer_spec), str(stem.with_suffix(".json"))]
    log = stem.with_suffix(".log")
    code, result.peak_rss_mib, result.wall_seconds = run_child(command, log, timeout, repo)
    if code != 0:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        reason = f"timed out after {timeout:.0f} s" if code is None else (lines[-1] if lines else f"exit {code}")
        return _failed(result, reason)
    try:
        if method.startswith("accumrun"):
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            result.epoch_samples_per_second = [float(row["samples_per_second"]) for row in rows]
        else:
            peer = json.loads(stem.with_suffix(".json").read_text())
            result.epoch_samples_per_second = [workload.samples / seconds for seconds in peer["epoch_seconds"]]
            result.jit_compile = peer["jit_compile"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return _failed(result, f"exited 0 but left no readable results: {error!r}")
    if len(result.epoch_samples_per_second) != epochs:
        return _failed(result, f"reported {len(result.epoch_samples_per_second)} epochs of {epochs}")
    # The first epoch traces (and maybe compiles) the step; it measures that, not training.
    result.samples_per_second = statistics.median(result.epoch_samples_per_second[1:])
    return result


def _failed(result: Result, reason: str) -> Result:
    result.status, result.error = "failed", reason
    return result


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _accumrun_revision() -> str:
    """The checkout's commit, with ``+changes`` when accumrun/ differs from it: its code is what was measured."""
    try:
        git = ["git", "-C", str(REPO)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run([*git, "status", "--porcelain", "accumrun"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and how busy it was when the run began."""
    return {
        "accumrun_revision": _accumrun_revision(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        # Versions from the package metadata: this process stays small by never importing TensorFlow, and a
        # child's ru_maxrss can include what it inherited from this process at fork.
        "tensorflow": version("tensorflow"),
        "keras": version("keras"),
        "python": platform.python_version(),
        "date": datetime.now().isoformat(timespec="seconds"),
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }


def publish_report(
    output: Path, *, title: str, command: str, info: dict[str, Any], figures: dict[str, Any], body: list[str]
) -> None:
    """Write a benchmark's report to ``output`` (Markdown: its title, the command that writes it, what it was
    measured on, from :func:`machine`, then ``body``), its ``figures`` and ``info`` beside it as JSON, and print the
    report."""
    figures_path = output.with_suffix(".json")
    figures_path.write_text(json.dumps({**figures, "machine": info}, indent=2) + "\n")
    shown = figures_path.resolve().relative_to(REPO) if figures_path.resolve().is_relative_to(REPO) else figures_path
    header = (
        f"# {title}\n\nWritten by `{command}`; every figure is also in `{shown}`.\n\n"
        f"- machine: {info['cpu']}, {info['cores']} cores; load average {info['load_average_at_start']} at the start\n"
        f"- TensorFlow {info['tensorflow']}, Keras {info['keras']}, Python {info['python']}; {info['date']}\n"
        f"- accumrun at {info['accumrun_revision']}\n"
    )
    report = "\n".join([header, *body]) + "\n"
    output.write_text(report)
    print(report, end="")


@dataclass
class Target:
    """One goal of the issue, its measured value and whether it was met."""

    target: str
    measured: str
    met: bool


def _ok(results: list[Result], workload: str, method: str, subdivisions: int | None = None) -> Result | None:
    for result in results:
        same_s = subdivisions is None or result.subdivisions == subdivisions
        if (result.workload, result.method, result.status) == (workload, method, "ok") and same_s:
            return result
    return None


def evaluate_targets(results: list[Result]) -> list[Target]:
    """The throughput targets, the RSS targets against ``fit_sub``, accumrun's memory against ``fit_sub`` at
    every S of the memory workload, and its memory as S grows there."""
    targets = []
    # A target whose runs were not in the plan is left out (the smoke run has dispatch alone); one whose run
    # failed is reported as not measured.
    ran = {(r.workload, r.method) for r in results}
    for workload, method, least in THROUGHPUT_TARGETS:
        if not {(workload, "accumrun"), (workload, method)} <= ran:
            continue
        ours, theirs = _ok(results, workload, "accumrun"), _ok(results, workload, method)
        goal = f"{workload}: accumrun samples/s >= {least:g}x {method}"
        if ours is None or theirs is None:
            targets.append(Target(goal, "not measured: a run failed", False))
            continue
        ratio = ours.samples_per_second / theirs.samples_per_second
        targets.append(Target(goal, f"{ratio:.2f}x", ratio >= least))
    for workload, most in RSS_TARGETS:
        if not {(workload, method) for method in MEMORY_METHODS} <= ran:
            continue
        ours, theirs = (_ok(results, workload, method) for method in MEMORY_METHODS)
        row = next(r for r in results if (r.workload, r.method) == (workload, "accumrun"))
        goal = (
            f"{workload}: accumrun peak RSS at batch {row.batch_size} <= {most:g}x fit_sub at batch "
            f"{row.batch_size // row.subdivisions}"
        )
        if ours is None or theirs is None:
            targets.append(Target(goal, "not measured: a run failed", False))
            continue
        ratio = ours.peak_rss_mib / theirs.peak_rss_mib
        targets.append(
            Target(goal, f"{ratio:.2f}x ({ours.peak_rss_mib:,.0f} / {theirs.peak_rss_mib:,.0f} MiB)", ratio <= most)
        )
    memory = sorted(
        {r.subdivisions: r for r in results if r.workload == "memory"}.values(), key=attrgetter("subdivisions")
    )
    series = []
    for row in memory:
        ours, theirs = (_ok(results, "memory", m, row.subdivisions) for m in MEMORY_METHODS)
        goal = (
            f"memory S={row.subdivisions}: accumrun peak RSS at batch {row.batch_size} <= "
            f"{MEMORY_RSS_LIMIT:g}x fit_sub at batch {row.batch_size // row.subdivisions}"
        )
        if ours is None or theirs is None:
            targets.append(Target(goal, "not measured: a run failed", False))
            continue
        ratio = ours.peak_rss_mib / theirs.peak_rss_mib
        targets.append(Target(goal, f"{ratio:.2f}x", ratio <= MEMORY_RSS_LIMIT))
        series.append((row.subdivisions, ours.peak_rss_mib))
    if memory:
        falls = len(series) == len(memory) > 1 and all(b[1] < a[1] for a, b in pairwise(series))
        measured = ", ".join(f"S={s}: {rss:,.0f}" for s, rss in series) + " MiB" if series else "not measured"
        targets.append(Target("memory: accumrun peak RSS falls at every step as S grows", measured, falls))
    return targets


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _workload_section(workload: Workload, results: list[Result]) -> list[str]:
    keys = ", ".join(f"{key} {value}" for key, value in workload.model.items() if key != "name")
    model = workload.model["name"] + (f" ({keys})" if keys else "")
    shape = "x".join(map(str, workload.shape))
    lines = [
        f"## {workload.name}: {model}, {workload.samples:,} samples of {shape}, "
        f"batch {workload.batch_size:,} = {workload.subdivisions} sub-batches of {workload.sub_batch}",
        "",
        "| method | samples/s | peak RSS MiB | accumrun ÷ method (samples/s) |",
        "| --- | ---: | ---: | ---: |",
    ]
    ours = _ok(results, workload.name, "accumrun")
    for method in workload.methods:
        row = next(r for r in results if (r.workload, r.method) == (workload.name, method))
        if row.status != "ok":
            lines.append(f"| {method} | failed: {_cell(row.error or '')} | - | - |")
            continue
        ratio = f"{ours.samples_per_second / row.samples_per_second:.2f}x" if ours else "-"
        lines.append(f"| {method} | {row.samples_per_second:,.0f} | {row.peak_rss_mib:,.0f} | {ratio} |")
    theirs = _ok(results, workload.name, "fit_sub")
    if ours and theirs:
        lines += [
            "",
            f"Peak RSS, accumrun at batch {workload.batch_size:,} ÷ fit_sub at batch {workload.sub_batch:,}: "
            f"{ours.peak_rss_mib / theirs.peak_rss_mib:.2f}x.",
        ]
    if "accumrun_xla" in workload.methods:
        lines += ["", f"`accumrun_xla` is accumrun with XLA (`--set {XLA_OVERRIDE}`); XLA is off by default."]
    else:
        lines += ["", "XLA is left out here: on a CPU its convolutions are far slower (see `performance-notes.md`)."]
    lines.append("")
    return lines


def _memory_section(memory: list[Workload], results: list[Result]) -> list[str]:
    if not memory:
        return []
    first = memory[0]
    lines = [
        f"## memory: {first.model['name']}, batch {first.batch_size:,} (all {first.samples:,} samples) "
        "in S sub-batches",
        "",
        "accumrun trains batch B in S sub-batches; `fit_sub` is plain `model.fit` at batch B/S, the memory that a",
        "sub-batch needs by itself.",
        "",
        "| S | sub-batch | accumrun samples/s | accumrun peak RSS MiB | fit_sub samples/s | fit_sub peak RSS MiB "
        "| RSS accumrun ÷ fit_sub |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for workload in memory:
        cells, rss = [str(workload.subdivisions), f"{workload.sub_batch:,}"], []
        for method in MEMORY_METHODS:
            row = _ok(results, "memory", method, workload.subdivisions)
            cells += [f"{row.samples_per_second:,.0f}", f"{row.peak_rss_mib:,.0f}"] if row else ["failed", "-"]
            rss.append(row.peak_rss_mib if row else None)
        cells.append(f"{rss[0] / rss[1]:.2f}x" if None not in rss else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def render_markdown(
    report: dict[str, Any], plan: list[Workload], results: list[Result], targets: list[Target], json_name: str
) -> str:
    """``docs/benchmarks.md``: the machine, the command, one table per workload and the targets."""
    info = report["machine"]
    lines = [
        "# Benchmarks: accumrun against its peers",
        "",
        f"Written by `benchmarks/run.py`; the raw numbers, every epoch's included, are in `{json_name}`.",
        "Streaming data from files (memory as a folder grows, uint8 against float32, speed against data in memory)",
        "has its own: `benchmarks/streaming.py` writes `benchmarks-streaming.md`; so does the cost of each",
        "`training.batch_norm` mode: `benchmarks/batch_norm.py` writes `benchmarks-batch-norm.md`; and the cost of",
        "per-sample dropout draws: `benchmarks/dropout.py` writes `benchmarks-dropout.md`; and a causal language",
        "model against `fit` and Keras' accumulation, and bucketed padding: `benchmarks/text.py` writes",
        "`benchmarks-text.md`.",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores (`os.cpu_count()`); load average "
        f"{info['load_average_at_start']} at the start, {info['load_average_at_end']} at the end",
        f"- TensorFlow {info['tensorflow']}, Keras {info['keras']}, Python {info['python']}; {info['date']}",
        f"- accumrun at {_revisions(info)}; command: `{report['command']}`",
        f"- {report['epochs']} epochs per run; total wall time {report['total_seconds']:.0f} s",
        "",
    ]
    if report["smoke"]:
        lines += ["**Smoke run**: tiny workloads. It checks the harness; its numbers mean nothing.", ""]
    if max(info["load_average_at_start"], info["load_average_at_end"]) > info["cores"]:
        lines += ["**Busy machine**: the load average exceeded the core count, so other processes competed for the"]
        lines += ["CPU and the samples/s are noisy; see the per-epoch values in the JSON.", ""]
    lines += [
        "Each method runs in a process of its own, one after another, on the same synthetic data and model from",
        "the same seed. samples/s is the median over epochs 2 to E (the first epoch traces the step); accumrun's",
        "comes from its `metrics.jsonl`, the peers' from a Keras callback (or the loop's own timer) around each",
        "epoch. Peak RSS is the child's `ru_maxrss` from `os.wait4`, for the whole process (TensorFlow included).",
        "",
        "| method | what it runs |",
        "| --- | --- |",
        "| accumrun | `python -m accumrun train CONFIG -q --no-tensorboard`: S sub-batches in one `tf.function` "
        "call, one update per batch |",
        f"| accumrun_xla | the same with `--set {XLA_OVERRIDE}` |",
        "| keras_accum | `model.fit` at batch B/S with `Adam(1e-3, gradient_accumulation_steps=S)` |",
        "| python_loop | a Python loop over B/S-sample batches of a `tf.data` pipeline; a `tf.function` per "
        "sub-batch adds its gradients into `tf.Variable`s; every S sub-batches their mean is applied, then zeroed |",
        "| fit_sub | plain `model.fit` at batch B/S (an update per sub-batch: not the same training) |",
        "| fit_full | plain `model.fit` at batch B |",
        "",
        "The Keras peers compile the loss alone (accumrun also computes its metric, accuracy) and keep Keras'",
        f"`jit_compile='auto'`, which here resolved to XLA {_xla_of_peers(results)}.",
        "",
    ]
    for workload in plan:
        if workload.name != "memory":
            lines += _workload_section(workload, results)
    lines += _memory_section([w for w in plan if w.name == "memory"], results)
    lines += ["## Targets", "", "| target | measured | result |", "| --- | --- | --- |"]
    lines += [f"| {t.target} | {t.measured} | {'met' if t.met else 'NOT met'} |" for t in targets]
    return "\n".join(lines) + "\n"


def _revisions(info: dict[str, Any]) -> str:
    start, end = info["accumrun_revision"], info["accumrun_revision_at_end"]
    # accumrun may be edited while a long run goes on; then the runs measured different code.
    return start if start == end else f"{start} at the start, {end} at the end"


def _xla_of_peers(results: list[Result]) -> str:
    used = {r.jit_compile for r in results if r.method in ("keras_accum", "fit_sub", "fit_full") and r.status == "ok"}
    return {frozenset({False}): "off", frozenset({True}): "on"}.get(frozenset(used), "on for some runs")


def _progress(index: int, count: int, result: Result) -> str:
    head = f"[{index:>2}/{count}] {result.workload:<12} S={result.subdivisions:<3} {result.method:<12}"
    if result.status != "ok":
        return f"{head} failed: {result.error} ({result.wall_seconds:.1f} s)"
    rates = f"{result.samples_per_second:>9,.0f} samples/s {result.peak_rss_mib:>7,.0f} MiB RSS"
    return f"{head} {rates} {result.wall_seconds:>6.1f} s"


def main() -> None:
    """Run every workload and method one after another; write the markdown and JSON reports."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md", help="markdown to write")
    parser.add_argument("--epochs", type=int, help="epochs per run, at least 2 (default 4; 2 with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="tiny workloads, to check that the harness works")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a run is killed (default 300)")
    args = parser.parse_args()
    epochs = args.epochs or (2 if args.smoke else 4)
    if epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is left out of the throughput")
    started = time.perf_counter()
    report: dict[str, Any] = {"machine": machine(), "command": shlex.join([sys.executable, *sys.argv])}
    plan = workloads(args.smoke)
    jobs = [(workload, method) for workload in plan for method in workload.methods]
    results = []
    with tempfile.TemporaryDirectory(prefix="accumrun-bench-") as work_dir:
        for index, (workload, method) in enumerate(jobs, 1):
            results.append(measure(workload, method, epochs, Path(work_dir), args.timeout))
            print(_progress(index, len(jobs), results[-1]), file=sys.stderr, flush=True)
    json_path = args.out.with_suffix(".json")
    report["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    report["machine"]["accumrun_revision_at_end"] = _accumrun_revision()
    report.update(epochs=epochs, smoke=args.smoke, total_seconds=time.perf_counter() - started)
    targets = evaluate_targets(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_markdown(report, plan, results, targets, json_path.name))
    raw = {**report, "targets": [asdict(t) for t in targets], "results": [asdict(r) for r in results]}
    json_path.write_text(json.dumps(raw, indent=2) + "\n")
    print(f"total wall time {report['total_seconds']:.0f} s; wrote {args.out} and {json_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
