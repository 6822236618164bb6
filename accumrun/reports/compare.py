"""Subdivisions on vs off, or any other key: the same config trained under several values of one key, side by
side.

Each variant is a separate ``accumrun train`` process, so that its peak memory is its own, and a run folder of
its own. All variants share the seed, hence the initial weights and every epoch's data order; only the varied key
(by default ``training.subdivisions``) differs.

Ctrl-C (or SIGTERM) stops the comparison as it stops a run: the variant under way stops at its batch boundary with
a checkpoint (Ctrl-C at a terminal reaches its process too; this one waits for it), the rest are not started, and
``compare.json``, kept current from the start, records each variant's status; :func:`resume_comparison` goes on
from there to the report an uninterrupted comparison writes.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accumrun.errors import ConfigError, DataError, Interrupted
from accumrun.kinds import BatchNormMode, RunState
from accumrun.reports.compare_noise import noise_scale_lines
from accumrun.reports.plot import plot_curves
from accumrun.rundir.atomic import write_text_atomically
from accumrun.rundir.layout import has_checkpoint
from accumrun.rundir.metrics import EpochRow, load_metrics, read_rows
from accumrun.rundir.status import BatchNormNote, RunRecord, read_status
from accumrun.stops import StopRequests, resume_command

SUBDIVISIONS = "training.subdivisions"
"""The key a comparison varies unless told another."""

_STOPPED = {128 + signal.SIGINT, 128 + signal.SIGTERM}
"""The exit codes of a train process that a signal stopped (130, 143)."""


@dataclass
class Variant:
    """One trained variant: its value of the varied key, where it ran, and how it went."""

    value: int | str
    """A subdivision count or ``auto`` (the variant settles it and records the count in its metrics rows), or the
    value of ``key``, as ``--set`` takes it."""
    run_dir: Path
    key: str = SUBDIVISIONS
    exit_code: int | None = None
    """The variant's ``accumrun train`` exit code; None until it has run."""
    error: str | None = None
    stop: str | None = None
    """Where a stopped variant stopped, as its process said it (``SIGINT at epoch 2, batch 1; saved ...``)."""
    running: bool = False
    metrics: list[EpochRow] = field(default_factory=list)
    started_epochs: list[int] = field(default_factory=lambda: [1])
    """The epoch each of the variant's train processes started at (a resumed one's too): each traces its step."""
    max_weight_difference: float | None = None
    batch_norm: BatchNormNote | None = None
    """The model's BatchNorm layers and mode, when it has some (from the variant's ``run.json``)."""

    @property
    def completed(self) -> bool:
        return self.exit_code == 0

    @property
    def timed_rows(self) -> list[EpochRow]:
        """The rows whose time is training's: each process's first, tracing epoch left out, where others remain."""
        return [row for row in self.metrics if row.epoch not in self.started_epochs] or self.metrics

    @property
    def stopped(self) -> bool:
        """A signal stopped it: its run resumes from its checkpoint (or starts again, stopped before one)."""
        return self.exit_code in _STOPPED

    @property
    def status(self) -> str:
        """``not started``, ``running``, ``completed``, ``stopped`` or ``failed (exit N)``, as the table and
        ``compare.json`` show it."""
        if self.running:
            return RunState.RUNNING.value
        if self.exit_code is None:
            return "not started"
        if self.stopped:
            return "stopped"
        return RunState.COMPLETED.value if self.completed else f"failed (exit {self.exit_code})"

    @property
    def short(self) -> str:
        """The variant in a column heading: ``S=4``, or the value of another key."""
        return f"S={self.value}" if self.key == SUBDIVISIONS else str(self.value)

    @property
    def name(self) -> str:
        """``subdivisions 4``, ``off (subdivisions 1)`` or ``optimizer.name=sgd``."""
        if self.key != SUBDIVISIONS:
            return f"{self.key}={self.value}"
        return "off (subdivisions 1)" if self.value == 1 else f"subdivisions {self.value}"

    @property
    def label(self) -> str:
        name = self.name
        if self.key == SUBDIVISIONS and self.value == "auto" and self.metrics:
            name += f" ({self.metrics[-1].subdivisions})"
        if not self.metrics or not self.completed:
            return f"{name}: {self.status}"
        seconds = statistics.median(row.seconds for row in self.timed_rows)
        rss = max(row.peak_rss_mib for row in self.metrics)
        return f"{name}: {seconds:.2f} s/epoch, peak {rss:,.0f} MiB RSS"

    def command(self, config_path: Path, overrides: list[str]) -> list[str]:
        """The ``accumrun train`` process that trains the variant: from its checkpoint where a stopped one has
        one, else from the start (replacing what a variant stopped before its first checkpoint left)."""
        train = [sys.executable, "-m", "accumrun", "train"]
        if has_checkpoint(self.run_dir):
            return [*train, "--resume", str(self.run_dir), "--quiet"]
        command = [*train, str(config_path), "--quiet"]
        command += [arg for override in overrides for arg in ("--set", override)]
        command += (
            ["--subdivisions", str(self.value)] if self.key == SUBDIVISIONS else ["--set", f"{self.key}={self.value}"]
        )
        command += ["--run-dir", str(self.run_dir)]
        return [*command, "--overwrite"] if self.run_dir.exists() else command

    def to_json(self) -> dict[str, Any]:
        """The variant as ``compare.json`` lists it, its rows as ``metrics.jsonl`` holds them."""
        batch_norm = self.batch_norm
        varied = {"subdivisions": self.value} if self.key == SUBDIVISIONS else {}
        return {
            **varied,
            "key": self.key,
            "value": self.value,
            "run_dir": str(self.run_dir),
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "stopped": self.stop,
            "metrics": [row.to_json() for row in self.metrics],
            "started_epochs": self.started_epochs,
            "max_weight_difference": self.max_weight_difference,
            "batch_norm": {"layers": batch_norm.layers, "mode": batch_norm.mode.value} if batch_norm else None,
            "label": self.label,
        }

    @classmethod
    def from_json(cls, entry: dict[str, Any], folder: Path) -> Variant:
        """The variant that ``compare.json`` in ``folder`` lists as ``entry``; its run folder is the comparison
        folder's child (``compare.json``'s path may be relative to another folder). A variant left ``running``
        (the comparison's process was killed) is to run again, from its checkpoint if it has one, unless its run
        completed; a file from before statuses were recorded lists finished variants only."""
        status = entry.get("status", RunState.COMPLETED.value)
        failed = re.fullmatch(r"failed \(exit (-?\d+)\)", status)
        exit_code = entry.get("exit_code", 0 if status == RunState.COMPLETED.value else None)
        if exit_code is None and failed:
            exit_code = int(failed.group(1))
        run_dir = folder / Path(entry["run_dir"]).name
        if status == RunState.RUNNING.value:
            exit_code = 0 if read_status(run_dir) is RunState.COMPLETED else None
        variant = cls(entry["value"], run_dir, entry["key"], exit_code, entry.get("error"))
        variant.stop = entry.get("stopped")
        variant.started_epochs = list(entry.get("started_epochs", [1]))
        return variant


@dataclass
class Comparison:
    """What ``compare`` did: the variants, and the report files it wrote."""

    variants: list[Variant]
    json_path: Path
    png_path: Path | None

    @property
    def failed(self) -> list[Variant]:
        return [v for v in self.variants if not v.completed]

    def table(self) -> str:
        """The per-epoch and per-variant tables (see :func:`format_table`)."""
        return format_table(self.variants)


def compare_runs(
    config_path: Path,
    values: list[int | str],
    out_dir: Path,
    overrides: list[str],
    *,
    echo: Callable[[str], None],
    key: str = SUBDIVISIONS,
) -> Comparison:
    """Train ``config_path`` once per value of ``key`` into ``out_dir/subdivisions-N`` (or ``out_dir/KEY-VALUE``;
    ``out_dir`` must be empty or new; a failed variant does not stop the rest), then write ``compare.json`` there,
    and ``compare.png`` when some variant has metrics: :func:`accumrun.compare`.

    Raises:
        Interrupted: SIGINT or SIGTERM stopped the comparison; ``compare.json`` says where each variant stands.
    """
    if out_dir.exists() and any(out_dir.iterdir()):
        # Exit 1, as train and export refuse an occupied output: the folder, not the command line, is at fault.
        raise ConfigError("run_dir", "exists and is not empty; choose another", str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = "subdivisions" if key == SUBDIVISIONS else key
    variants = [Variant(value, out_dir / f"{folder}-{value}", key) for value in values]
    return _run_variants(_Report(config_path, overrides, out_dir, variants), echo)


def resume_comparison(out_dir: Path, *, echo: Callable[[str], None]) -> Comparison:
    """Go on with the comparison in ``out_dir`` that a signal stopped: resume its stopped variant from its
    checkpoint, train those not started, and write the report an uninterrupted comparison writes:
    :func:`accumrun.resume_compare`.

    Raises:
        ConfigError: ``out_dir`` holds no comparison, or every variant of it has run.
        Interrupted: SIGINT or SIGTERM stopped it again.
    """
    report = _Report.read(out_dir)
    if all(v.exit_code is not None and not v.stopped for v in report.variants):
        raise ConfigError("resume", "every variant of this comparison has run; start a new comparison", str(out_dir))
    if not report.config_path.is_file():
        # Its path is as the comparison was given it: relative to the folder it ran in.
        what = "is not found from here; resume in the folder the comparison ran in"
        raise ConfigError("resume", f"the comparison's config {report.config_path} {what}", str(out_dir))
    for variant in report.variants:
        if variant.completed:
            _read_results(variant)
    return _run_variants(report, echo)


@dataclass
class _Report:
    """``compare.json``: what was compared (the config, the overrides every variant takes) and the variants."""

    config_path: Path
    overrides: list[str]
    out_dir: Path
    variants: list[Variant]

    @classmethod
    def read(cls, out_dir: Path) -> _Report:
        path = out_dir / "compare.json"
        try:
            document = json.loads(path.read_text())
            variants = [Variant.from_json(entry, out_dir) for entry in document["variants"]]
            return cls(Path(document["config"]), list(document.get("overrides", [])), out_dir, variants)
        except OSError:
            raise ConfigError("resume", "holds no compare.json: not a comparison's folder", str(out_dir)) from None
        except (ValueError, KeyError, TypeError) as error:
            raise DataError(str(path), f"cannot be read as a comparison: {error}") from None

    def write(self, *, plot: bool = False) -> Comparison:
        """Write ``compare.json`` (and with ``plot``, ``compare.png`` when some variant has metrics)."""
        document = {
            "config": str(self.config_path),
            "overrides": self.overrides,
            "variants": [v.to_json() for v in self.variants],
        }
        json_path = write_text_atomically(self.out_dir / "compare.json", json.dumps(document, indent=2) + "\n")
        curves = {v.label: [row.to_json() for row in v.metrics] for v in self.variants if v.metrics}
        key = self.variants[0].key
        title = f"{self.config_path.name}: {'subdivisions' if key == SUBDIVISIONS else key} compared"
        png_path = plot_curves(curves, self.out_dir / "compare.png", title=title) if plot and curves else None
        return Comparison(self.variants, json_path, png_path)


def _run_variants(report: _Report, echo: Callable[[str], None]) -> Comparison:
    """Train each variant of ``report`` that has not run or was stopped, in order, keeping ``compare.json``
    current; stop at a signal, or when a variant's process was stopped by one."""
    report.write()
    with StopRequests() as requests:
        for variant in report.variants:
            if variant.exit_code is not None and not variant.stopped:
                continue  # it ran in an earlier session
            if requests.signal_number is not None:
                break
            command = variant.command(report.config_path, report.overrides)
            resuming = "--resume" in command
            variant.started_epochs = [*variant.started_epochs, _next_epoch(variant.run_dir)] if resuming else [1]
            how = "resuming" if resuming else "training with"
            echo(f"== {how} {variant.name} -> {variant.run_dir}")
            variant.running = True
            report.write()
            # A second Ctrl-C stops the variant's process at once; this one waits for it to have stopped.
            with requests.child_stops():
                finished = subprocess.run(command, stderr=subprocess.PIPE, text=True)
            variant.running = False
            _record_exit(variant, finished, echo)
            report.write()
            if variant.stopped:
                break
    # A signal while the last variant ran, which completed all the same, leaves nothing to resume.
    if all(v.exit_code is not None and not v.stopped for v in report.variants):
        _fill_weight_differences(report.variants)
        return report.write(plot=True)
    stopped = [v.exit_code - 128 for v in report.variants if v.stopped and v.exit_code is not None]
    number = requests.signal_number or stopped[0]
    comparison = report.write(plot=True)
    lines = [f"  {v.name}: {v.status}" + (f" ({v.stop})" if v.stop else "") for v in report.variants]
    reason = f"compare stopped by {signal.Signals(number).name}; wrote {comparison.json_path}:\n" + "\n".join(lines)
    raise Interrupted(number, reason, resume_command(report.out_dir, "compare"))


def _record_exit(variant: Variant, finished: subprocess.CompletedProcess[str], echo: Callable[[str], None]) -> None:
    """How the variant's process ended: its rows and notes when it completed, where it stopped, or its error."""
    variant.exit_code, variant.error, variant.stop, variant.metrics = finished.returncode, None, None, []
    lines = [line for line in finished.stderr.strip().splitlines() if line.strip()]
    if variant.completed:
        _read_results(variant)
    elif variant.stopped:
        # Its last words before how to resume it alone, which resuming the comparison does.
        said = [line for line in lines if not line.startswith("resume with: ")]
        variant.stop = said[-1].strip().split("; resume")[0] if said else "stopped"
        with contextlib.suppress(DataError):  # no epoch logged before the stop
            variant.metrics = read_rows(variant.run_dir)  # the epochs before it, drawn in compare.png
        echo(f"   stopped: {variant.stop}")
    else:
        variant.error = lines[-1].removeprefix("Error: ") if lines else "no error message"
        echo(f"   failed: {variant.error}")


def _read_results(variant: Variant) -> None:
    """A completed variant's rows and BatchNorm note, from its run folder."""
    variant.metrics = read_rows(variant.run_dir)
    record = RunRecord.read(variant.run_dir)
    variant.batch_norm = record.batch_norm if record is not None else None


def compared_curves(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The metrics rows of each variant of the comparison in ``folder`` (by its ``compare.json``) that has some,
    under the variant's name (``subdivisions 4``, ``optimizer.name=sgd``; an unfinished one's with its status,
    ``off (subdivisions 1): stopped``): what ``accumrun plot`` draws of it. A variant's rows are read from its run
    folder's ``metrics.jsonl``, so a variant resumed since is drawn whole."""
    curves = {}
    for variant in _listed_variants(folder):
        if (variant.run_dir / "metrics.jsonl").is_file():
            curves[variant.name if variant.completed else f"{variant.name}: {variant.status}"] = load_metrics(
                variant.run_dir
            )
    if not curves:
        raise DataError(str(folder), "no variant of this comparison has metrics to plot")
    return curves


def unplotted_variants(folder: Path) -> list[str]:
    """The variants of the comparison in ``folder`` that have no rows to draw, named with their status where
    ``compare.json`` records one (``subdivisions 2: not started``)."""
    return [
        variant.name if variant.completed else f"{variant.name}: {variant.status}"
        for variant in _listed_variants(folder)
        if not (variant.run_dir / "metrics.jsonl").is_file()
    ]


def _listed_variants(folder: Path) -> list[Variant]:
    try:
        listed = json.loads((folder / "compare.json").read_text())["variants"]
        return [Variant.from_json(entry, folder) for entry in listed]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(str(folder / "compare.json"), f"cannot be read as a comparison: {error}") from None


def _fill_weight_differences(variants: list[Variant]) -> None:
    """Largest absolute difference of every final weight (BatchNorm statistics included) to the first variant."""
    done = [v for v in variants if v.completed]
    if len(done) < 2:
        return
    import keras

    reference = keras.models.load_model(done[0].run_dir / "model.keras", compile=False).get_weights()
    done[0].max_weight_difference = 0.0
    for variant in done[1:]:
        own = keras.models.load_model(variant.run_dir / "model.keras", compile=False).get_weights()
        if [w.shape for w in own] != [w.shape for w in reference]:
            continue  # another model: no weight to compare
        variant.max_weight_difference = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, own, strict=True))


def format_table(variants: list[Variant]) -> str:
    """Per-epoch losses of each variant and their difference to the first, then a summary per variant."""
    done = [v for v in variants if v.metrics]
    lines = []
    if done:
        header = ["epoch", *(f"{what} {v.short}" for v in done for what in ("loss", "val"))]
        if len(done) > 1:
            header += ["max |d loss|", "max |d val|"]
        lines.append(" | ".join(f"{h:>13}" for h in header))
        for index in range(max(len(v.metrics) for v in done)):
            rows = [v.metrics[index] if index < len(v.metrics) else None for v in done]
            cells = [f"{index + 1:>13}"]
            for row in rows:
                cells += [_number(row.loss if row else None), _number(row.figures.get("val_loss") if row else None)]
            if len(done) > 1:
                cells += [_spread(rows, "loss"), _spread(rows, "val_loss")]
            lines.append(" | ".join(cells))
        lines.append("")
    varied = variants[0].key.removeprefix("training.") if variants else "subdivisions"
    columns = [varied, "s/epoch", "samples/s", "peak RSS MiB", "peak GPU MiB", "max |d weight|"]
    lines.append(" | ".join(f"{h:>14}" for h in columns) + " | status")
    for v in variants:
        cells = [str(v.value)] + ["-"] * 5
        if v.metrics:
            gpu, weights = v.metrics[-1].peak_device_mib is not None, v.max_weight_difference
            cells[1:] = [
                f"{statistics.median(r.seconds for r in v.timed_rows):.2f}",
                f"{statistics.median(r.samples_per_second for r in v.timed_rows):,.0f}",
                f"{max(r.peak_rss_mib for r in v.metrics):,.0f}",
                f"{max(r.peak_device_mib or 0.0 for r in v.metrics):,.0f}" if gpu else "-",
                f"{weights:.2e}" if weights is not None else "-",
            ]
        detail = v.error or v.stop
        lines.append(" | ".join(f"{cell:>14}" for cell in cells) + f" | {v.status}" + (f": {detail}" if detail else ""))
    lines += noise_scale_lines([(v.name, v.metrics) for v in variants])
    batch_norm = next((v.batch_norm for v in variants if v.batch_norm), None)
    subdivided = bool(variants) and variants[0].key == SUBDIVISIONS  # other keys' variants differ by design
    if subdivided and batch_norm is not None and batch_norm.mode is not BatchNormMode.FROZEN:
        lines.append(
            f"\nnote: the model has {batch_norm.layers} BatchNorm layers (batch_norm: {batch_norm.mode.value}); each "
            "sub-batch is normalized with its own statistics, so the variants are not expected to match (batch_norm: "
            "frozen makes them match)"
        )
    return "\n".join(lines)


def _next_epoch(run_dir: Path) -> int:
    """The epoch a resumed run starts at: the one after its last logged row."""
    with contextlib.suppress(DataError):  # stopped before its first epoch's row
        return read_rows(run_dir)[-1].epoch + 1
    return 1


def _number(value: float | None) -> str:
    return f"{value:>13.6f}" if value is not None else f"{'-':>13}"


def _spread(rows: list[EpochRow | None], key: str) -> str:
    values = [r.figure(key) for r in rows if r is not None and (key == "loss" or key in r.figures)]
    return f"{max(values) - min(values):>13.2e}" if len(values) > 1 else f"{'-':>13}"
