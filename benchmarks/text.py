"""A causal language model under accumulation against Keras ``fit``, each variant in a process of its own.

The built-in causal ``transformer`` on windows of ``make-example corpus`` text (files of 1 to 30 sentences, so
many windows are short and padded), batch B in S sub-batches, Adam. The variants:

- ``accumrun``: accumrun's step (token-exact accumulation), each batch padded to ``sequence_length``;
- ``fit_B``: Keras ``fit`` at batch B, the loss per real token (``ignore_class=0``), all of B's activations at once;
- ``fit_B/S``: ``fit`` at batch B/S, the memory accumrun keeps to (S times as many updates);
- ``keras_accum``: ``fit`` at B/S with Keras 3's ``gradient_accumulation_steps=S`` (one update per S steps).

Bucketed padding pays where texts differ in length, so it is measured on a corpus of mixed lengths: the same text
cut into ``--mixed-files`` files of 4 to ``sequence_length + 1`` bytes (drawn uniformly), one window each, whose
real lengths spread from 3 tokens to the full length. On it:

- ``accumrun``: as above;
- ``accumrun_bucket``: ``data.bucket``: each batch's windows ordered by real length (accumrun's grouping), each
  sub-batch padded to its longest window, rounded up to a multiple of ``--bucket``;
- ``accumrun_bucket_ungrouped``: bucketed padding over batches left in the epoch's random order (what ``bucket``
  did before it grouped), to show what the grouping adds.

The accumrun variants are fed by accumrun's own feeder, in the seed's order, as a run is. A child trains ``epochs``
epochs and reports the median samples/s of all but the first (which traces), the same per CPU second of the process
(which other processes on a shared machine do not stretch), its peak RSS (``ru_maxrss``) and, for
bucketed padding, the share of the full-length positions its sub-batches run. Run from the repository root; it
writes ``docs/benchmarks-text.md`` and the figures beside it:

    python benchmarks/text.py [--layers L --width W --heads H --sequence-length N --batch B --subdivisions S
                               --files F --mixed-files M --epochs E --bucket K] [--output PATH]

The issue's workload is ``--layers 3 --width 512 --heads 8 --sequence-length 256 --batch 64 --subdivisions 8``
(about 10M parameters); the defaults are a smaller one that fits this 2-core machine's time.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from run import machine, publish_report  # benchmarks/run.py, beside this script

VARIANTS = ("accumrun", "fit_B", "fit_B/S", "keras_accum")
MIXED_VARIANTS = ("accumrun", "accumrun_bucket", "accumrun_bucket_ungrouped")
SPEED_TARGET, MEMORY_TARGET, BUCKET_TARGET = 1.0, 1.1, 1.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--subdivisions", type=int, default=8)
    parser.add_argument("--files", type=int, default=120, help="corpus files of 1 to 30 sentences")
    parser.add_argument("--mixed-files", type=int, default=600, help="files of the corpus of mixed lengths")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bucket", type=int, default=32)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-text.md"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    info = machine()
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    mixed: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "corpus"
        subprocess.run(
            [sys.executable, "-m", "accumrun", "make-example", "corpus", str(corpus), "--count", str(args.files)],
            check=True,
            capture_output=True,
        )
        mixed_corpus = _mixed_corpus(corpus, Path(folder) / "mixed", args.mixed_files, args.sequence_length)
        for variants, on, into in ((VARIANTS, corpus, results), (MIXED_VARIANTS, mixed_corpus, mixed)):
            for variant in variants:
                into[variant] = _run_child(args, variant, on, Path(folder) / "result.json")
                print(variant, on.name, into[variant], file=sys.stderr)
    _report(args, info, results, mixed, time.perf_counter() - started)


def _mixed_corpus(corpus: Path, folder: Path, files: int, length: int) -> Path:
    """``files`` files cut from the text of ``corpus``, one after another (from its start again when it runs out),
    each 4 to ``length + 1`` bytes long (drawn uniformly, from a fixed seed): one window each, of 3 to ``length``
    real tokens."""
    text = " ".join(path.read_text(encoding="utf-8").strip() for path in sorted(corpus.glob("*.txt")))
    draw = random.Random(0)
    folder.mkdir()
    start = 0
    for index in range(files):
        size = draw.randint(4, length + 1)
        if start + size > len(text):  # from the start again: the windows' lengths are what matters here
            start = 0
        (folder / f"{index:05d}.txt").write_text(text[start : start + size], encoding="utf-8")
        start += size
    return folder


def _run_child(args: argparse.Namespace, variant: str, corpus: Path, result: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", variant, "--corpus", str(corpus), "--result", str(result)]
    options = ("layers", "width", "heads", "sequence_length", "batch", "subdivisions", "epochs", "bucket")
    for name in options:
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    subprocess.run(command, check=True, capture_output=True)
    figures: dict[str, Any] = json.loads(result.read_text())
    return figures


def _child(args: argparse.Namespace) -> None:
    """Train one variant; write its samples/s per epoch and peak RSS to ``args.result``."""
    import keras
    import numpy as np

    from accumrun.config.schema import data_config
    from accumrun.core.losses import Objective, sparse_categorical_crossentropy
    from accumrun.core.step import make_train_step
    from accumrun.core.sub_batches import batch_sizes, sub_batch_sizes
    from accumrun.data.dataset import load_dataset
    from accumrun.data.feeder import Feeder
    from accumrun.models.transformer import transformer

    length, batch, subdivisions = args.sequence_length, args.batch, args.subdivisions
    config = data_config(name="text_corpus", path=str(args.corpus), sequence_length=length, validation_split=0.0)
    split = load_dataset(config, 0).train
    x, y = split.x, split.y
    bucketed = args.child.startswith("accumrun_bucket")
    grouped = args.child == "accumrun_bucket"
    keras.utils.set_random_seed(0)
    model = transformer(
        (length,),
        257,
        257,
        layers=args.layers,
        heads=args.heads,
        width=args.width,
        dropout=0.0,
        causal=True,
        any_length=bucketed,
    )
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    positions = 1.0
    if args.child.startswith("accumrun"):
        optimizer = keras.optimizers.Adam(1e-3)
        objective = Objective(sparse_categorical_crossentropy, token_level=True)
        step = make_train_step(model, objective, optimizer, subdivisions, bucket=args.bucket if bucketed else None)
        sizes = batch_sizes(len(x), batch)
        # The order of a run with seed 0: a permutation per epoch, each batch grouped by length with bucket.
        feeder = Feeder(split, sizes, seed=0, shuffle=True, group_by_length=sizes if grouped else None)
        for epoch in range(args.epochs):
            begun, cpu_begun = time.perf_counter(), time.process_time()
            for x_batch, y_batch in feeder.epoch(epoch):
                loss = step(x_batch, y_batch).loss_sum
            float(loss)  # wait for the last step
            seconds.append(time.perf_counter() - begun)
            cpu_seconds.append(time.process_time() - cpu_begun)
        if bucketed:
            assert feeder.resident is not None
            real = np.count_nonzero(x, axis=1)
            run = 0
            for index, size in enumerate(sizes):
                rows, start = feeder.resident.chunk_rows(0, index), 0
                for part in sub_batch_sizes(size, subdivisions):
                    longest = int(real[rows[start : start + part]].max())
                    run += part * min(length, -(-longest // args.bucket) * args.bucket)
                    start += part
            positions = run / (len(x) * length)
    else:
        accumulate = {"gradient_accumulation_steps": subdivisions} if args.child == "keras_accum" else {}
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3, **accumulate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
        )
        timer = _epoch_timer(keras)
        batch_size = batch if args.child == "fit_B" else max(1, batch // subdivisions)
        model.fit(x, y, batch_size=batch_size, epochs=args.epochs, shuffle=True, verbose=0, callbacks=[timer])
        seconds, cpu_seconds = timer.seconds, timer.cpu_seconds
    rates = [len(x) / s for s in seconds]
    cpu_rates = [len(x) / s for s in cpu_seconds]
    args.result.write_text(
        json.dumps(
            {
                "samples": len(x),
                "parameters": model.count_params(),
                "real_tokens": int((y != 0).sum()),
                "epoch_samples_per_second": rates,
                "samples_per_second": statistics.median(rates[1:]),
                "samples_per_cpu_second": statistics.median(cpu_rates[1:]),
                "positions_run": positions,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def _epoch_timer(keras: Any) -> Any:
    """A Keras callback that keeps the wall time of every epoch of ``fit`` (``keras`` is imported by the child
    alone, so the parent stays small)."""

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.cpu_seconds: list[float] = []
            self._begun = self._cpu_begun = 0.0

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._begun, self._cpu_begun = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.seconds.append(time.perf_counter() - self._begun)
            self.cpu_seconds.append(time.process_time() - self._cpu_begun)

    return EpochTimer()


def _report(
    args: argparse.Namespace,
    info: dict[str, Any],
    results: dict[str, dict[str, Any]],
    mixed: dict[str, dict[str, Any]],
    total: float,
) -> None:
    fit = results["fit_B"]
    first = results["accumrun"]
    speed = first["samples_per_second"] / fit["samples_per_second"]
    memory = first["peak_rss_mib"] / results["fit_B/S"]["peak_rss_mib"]
    padded = mixed["accumrun"]
    speed_padded = padded["samples_per_second"]
    bucket = mixed["accumrun_bucket"]["samples_per_second"] / speed_padded
    ungrouped = mixed["accumrun_bucket_ungrouped"]["samples_per_second"] / speed_padded
    cpu_padded = padded["samples_per_cpu_second"]
    bucket_cpu = mixed["accumrun_bucket"]["samples_per_cpu_second"] / cpu_padded
    body = [
        f"Causal transformer ({args.layers} layers, width {args.width}, {args.heads} heads; "
        f"{first['parameters']:,} parameters), byte tokens, windows of {args.sequence_length} from "
        f"`make-example corpus --count {args.files}`: {first['samples']:,} windows, {_real(first, args):.0%} of their "
        f"positions real tokens. Batch {args.batch} in {args.subdivisions} sub-batches, Adam; {args.epochs} epochs "
        f"per variant, each in its own process; samples/s is the median over the epochs after the first. "
        f"{total:.0f} s in all.",
        "",
        "| variant | samples/s | ÷ fit at B | peak RSS MiB | ÷ fit at B/S |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {r['samples_per_second']:,.0f} | {r['samples_per_second'] / fit['samples_per_second']:.2f}x | "
            f"{r['peak_rss_mib']:,.0f} | {r['peak_rss_mib'] / results['fit_B/S']['peak_rss_mib']:.2f}x |"
            for name, r in results.items()
        ),
        "",
        f"Bucketed padding, on a corpus of mixed lengths: the same text cut into {args.mixed_files} files of 4 to "
        f"{args.sequence_length + 1} bytes, {padded['samples']:,} windows of 3 to {args.sequence_length} real tokens, "
        f"{_real(padded, args):.0%} of their positions real. `bucket: {args.bucket}`; the same model, batch and "
        "sub-batches. *positions run*: the sub-batches' lengths after the cut, times their windows, over the "
        "full length's (epoch 1). *samples per CPU second*: over the process's CPU time (all its threads) rather "
        "than the wall's, which other processes on a shared machine do not stretch.",
        "",
        "| variant | samples/s | ÷ accumrun | samples per CPU second | ÷ accumrun | positions run | peak RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {r['samples_per_second']:,.0f} | {r['samples_per_second'] / speed_padded:.2f}x | "
            f"{r['samples_per_cpu_second']:,.0f} | {r['samples_per_cpu_second'] / cpu_padded:.2f}x | "
            f"{r['positions_run']:.0%} | {r['peak_rss_mib']:,.0f} |"
            for name, r in mixed.items()
        ),
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
        f"| accumrun samples/s >= 1.0x `fit` at B | {speed:.2f}x | {_met(speed >= SPEED_TARGET)} |",
        f"| accumrun peak RSS <= 1.1x `fit` at B/S | {memory:.2f}x | {_met(memory <= MEMORY_TARGET)} |",
        f"| bucketed padding (bucket {args.bucket}) >= 1.3x padding to the full length, on mixed lengths | "
        f"{bucket:.2f}x | {_met(bucket >= BUCKET_TARGET)} |",
    ]
    publish_report(
        args.output,
        title="Benchmark: a causal language model under accumulation",
        command=" ".join(["python", "benchmarks/text.py", *sys.argv[1:]]),
        info=info,
        figures={
            "results": results,
            "mixed_lengths": mixed,
            "speed": speed,
            "memory": memory,
            "bucket": bucket,
            "bucket_ungrouped": ungrouped,
            "bucket_cpu": bucket_cpu,
        },
        body=body,
    )


def _real(result: dict[str, Any], args: argparse.Namespace) -> float:
    """The share of a corpus' window positions that are real tokens."""
    return float(result["real_tokens"]) / (result["samples"] * args.sequence_length)


def _met(met: bool) -> str:
    return "met" if met else "NOT met"


if __name__ == "__main__":
    main()
