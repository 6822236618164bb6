"""Benchmark the memory of fine-tuning a causal language model: full fine-tuning with Adam, LoRA (rank 8 on the
attention's query and value) and LoRA on an int8 base (``model.quantize: int8``).

The model is a KerasHub GPT-2 backbone of about 50M parameters built locally (presets cannot be downloaded: 10
layers, width 640, 10 heads, feed-forward 2560, byte tokens), at sequence length 256, a batch of 32 in sub-batches
of 4 (``subdivisions: 8``), for ``--updates`` updates. Each variant trains in a fresh child process (this script
again, with ``--child``), one after another. A child measures its resident memory once TensorFlow, Keras, KerasHub
and accumrun are imported (``VmRSS``), trains through ``accumrun.train``, and reports its peak (``ru_maxrss``)
above that import, with the loss of each update, the training's own peak (the ``peak_rss_mib`` its last epoch
logged, before ``model.keras`` is written) and the accumrun function that was running at the peak (a thread polls
the resident memory every 20 ms).

The fixed bytes are arithmetic, from the built model (:func:`accumrun.models.lora.weight_counts`): the weights as
held (int8 where quantized), and for each trainable parameter 4 bytes of gradient, 4 of accumulator and 8 of Adam's
two slots. What the peak holds beyond them is the activations of a sub-batch and the runtime's own (the traced
step, TensorFlow's allocator): ``activations = peak above import - fixed``. An int8 base is built in float32 and
quantized, so its float weights count in its peak too.

``--tensor-peak`` runs the children on TensorFlow's BFC allocator for the CPU (``TF_CPU_ALLOCATOR_USE_BFC``) and adds
the peak of TensorFlow's own tensors (``tf.config.experimental.get_memory_info``): the weights, the optimizer's
state and the activations, without Python, the traced graphs or the allocator's slack, and steadier from run to run
than the resident memory. ``--variants`` measures some of the variants (each ratio needs ``full``), and ``--remat``
trains every variant with that ``training.remat`` (``none`` by default). ``--size 200m`` measures a backbone of
about 200M parameters instead (16 layers, width 1024, 16 heads, feed-forward 4096), where the fixed bytes weigh
more against the activations and the runtime. ``--malloc-arenas N`` caps glibc's malloc
at N arenas in the children (``MALLOC_ARENA_MAX``): by default it keeps up to 8 per core, and memory that one thread
freed in its arena is not reused by another's allocations.

On a machine with a GPU the same command trains there, adds the device's peak (``get_memory_info("GPU:0")``), and
reads the activations, the ratios and the targets on it: there the weights, the optimizer's state and the
activations are in the device's memory, and the resident memory is the host's alone.

Targets (issue 48): LoRA's peak above import at most 0.5x full fine-tuning's, LoRA on int8 at most 0.4x. Run from
anywhere:

    python benchmarks/lora_memory.py [--updates N] [--output PATH] [--tensor-peak] [--variants full,lora]
        [--remat none|activations|blocks|layers] [--size 50m|200m] [--malloc-arenas N]

The Markdown report goes to stdout, progress to stderr, every figure to the JSON ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIZES = {
    "50m": {"num_layers": 10, "num_heads": 10, "hidden_dim": 640, "intermediate_dim": 2560, "dropout": 0.1},
    "200m": {"num_layers": 16, "num_heads": 16, "hidden_dim": 1024, "intermediate_dim": 4096, "dropout": 0.1},
}
SEQUENCE, BATCH, SUBDIVISIONS = 256, 32, 8
VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"lora": {"rank": 8, "targets": ["query", "value"]}},
    "lora_int8": {"lora": {"rank": 8, "targets": ["query", "value"]}, "quantize": "int8"},
}
TARGETS = {"lora": 0.5, "lora_int8": 0.4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--size", choices=tuple(SIZES), default="50m")
    parser.add_argument("--remat", choices=("none", "activations", "blocks", "layers"), default="none")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--tensor-peak", action="store_true")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--malloc-arenas", type=int, default=None)
    parser.add_argument("--child", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.variants.split(",")
    if unknown := sorted(set(names) - set(VARIANTS)):
        parser.error(f"--variants: unknown {', '.join(unknown)} (the variants: {', '.join(VARIANTS)})")
    if args.child:
        child(args.child, args.folder, args.updates, args.remat, SIZES[args.size])
        return
    started = time.time()
    load = os.getloadavg()[0]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
        if args.tensor_peak:
            env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        if args.malloc_arenas is not None:
            env["MALLOC_ARENA_MAX"] = str(args.malloc_arenas)
        for name in names:
            print(f"{name} ...", file=sys.stderr, flush=True)
            subprocess.run(
                [sys.executable, __file__, "--child", name, "--folder", folder, "--updates", str(args.updates)]
                + ["--remat", args.remat, "--size", args.size],
                check=True,
                env=env,
            )
            results[name] = json.loads((Path(folder) / f"{name}.json").read_text())
    report = {
        "variants": results,
        "updates": args.updates,
        "remat": args.remat,
        "size": args.size,
        "malloc_arena_max": args.malloc_arenas,
        "load_average": [load, os.getloadavg()[0]],
        "seconds": time.time() - started,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    print(markdown(report))
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=1) + "\n")


def child(name: str, folder: Path, updates: int, remat: str, gpt2: dict[str, Any]) -> None:
    """Train variant ``name`` of the backbone ``gpt2`` for ``updates`` updates and write its figures to
    ``folder/<name>.json``."""
    import resource

    import keras_hub  # noqa: F401  (imported before the baseline, as training imports it)

    import accumrun
    from accumrun.config.loading import load_config
    from accumrun.data.examples import write_corpus
    from accumrun.models.lora import weight_counts

    imported = _rss_bytes()
    corpus = folder / "corpus"
    if not corpus.exists():
        # One file of exactly one batch of windows (256 + 1 byte tokens, 256 apart): an epoch is one update.
        write_corpus(folder / "sentences", 200, seed=0)
        text = "".join(path.read_text() for path in sorted((folder / "sentences").glob("*.txt")))
        size = BATCH * SEQUENCE + 1
        corpus.mkdir()
        (corpus / "corpus.txt").write_text((text * (size // len(text) + 1))[:size])
    config = load_config(
        {
            "seed": 0,
            "data": {"name": "text_corpus", "path": str(corpus), "sequence_length": SEQUENCE, "validation_split": 0.0},
            "model": {"name": "keras_hub.models.GPT2Backbone", **gpt2, **VARIANTS[name]},
            "training": {
                "epochs": updates,
                "batch_size": BATCH,
                "subdivisions": SUBDIVISIONS,
                "drop_remainder": True,
                "remat": remat,
            },
            "optimizer": {"name": "adam", "learning_rate": 1e-3 if name == "full" else 1e-2},
            "output": {"tensorboard": False, "checkpoint_every": None},
        }
    )
    started = time.monotonic()
    with PeakWatcher() as watcher:
        result = accumrun.train(config, folder / name, quiet=True)
    seconds = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    counts = weight_counts(result.model)
    fixed = counts.bytes + 16 * counts.trainable
    figures = {
        "parameters": counts.total,
        "trainable": counts.trainable,
        "weight_bytes": counts.bytes,
        "unquantized_weight_bytes": counts.unquantized_bytes,
        "fixed_bytes": fixed,
        "import_rss_bytes": imported,
        "peak_above_import_bytes": peak - imported,
        "activation_bytes": peak - imported - fixed,
        "losses": [row["loss"] for row in result.metrics],
        "peak_rss_mib_logged": result.metrics[-1].get("peak_rss_mib"),
        "peak_device_mib_logged": result.metrics[-1].get("peak_device_mib"),
        "peak_during": watcher.during,
        "updates": result.metrics[-1]["optimizer_steps"],
        "seconds": seconds,
    }
    import tensorflow as tf

    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") == "true":  # --tensor-peak
        figures["tensor_peak_bytes"] = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    if tf.config.list_physical_devices("GPU"):
        # There the weights, the optimizer's state and the activations are in the device's memory.
        figures["device_peak_bytes"] = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    (folder / f"{name}.json").write_text(json.dumps(figures))


class PeakWatcher:
    """Polls the resident memory every 20 ms while the run trains, and keeps the accumrun function that was running
    when it was highest (``during``): whether the peak is the training's or the saving's."""

    def __init__(self) -> None:
        import threading

        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._highest = 0
        self.during = ""

    def __enter__(self) -> PeakWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        import traceback

        while not self._stop.wait(0.02):
            rss = _rss_bytes()
            if rss > self._highest:
                self._highest = rss
                frame = sys._current_frames().get(self._main)
                stack = traceback.extract_stack(frame) if frame is not None else []
                ours = [f"{Path(f.filename).stem}.{f.name}" for f in stack if "/accumrun/" in f.filename]
                self.during = ours[-1] if ours else ""


def _rss_bytes() -> int:
    """This process's resident memory now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def markdown(report: dict[str, Any]) -> str:
    variants = report["variants"]
    full = variants.get("full", {})
    tensors = all("tensor_peak_bytes" in v for v in variants.values())
    # On a GPU the targets are read on the device's peak, and the process's resident memory is the host's alone.
    device = all("device_peak_bytes" in v for v in variants.values())
    measure = "device_peak_bytes" if device else "peak_above_import_bytes"
    rows = [
        "| variant | parameters (trainable) | weights | fixed | activations + runtime | peak above import | "
        f"vs full{' (device)' if device else ''} | target | training's peak | peak during | loss per update |"
        + (" tensor peak (vs full) |" if tensors else "")
        + (" device peak |" if device else ""),
        "| --- " * (11 + tensors + device) + "|",
    ]
    for name, v in variants.items():
        ratio, target = _ratio(v, full, measure), TARGETS.get(name)
        verdict = "" if target is None or ratio is None else f"<= {target}x: {'met' if ratio <= target else 'not met'}"
        losses = ", ".join(f"{loss:.3f}" for loss in v["losses"])
        activations = v[measure] - v["fixed_bytes"]
        row = (
            f"| {name} | {v['parameters']:,} ({v['trainable']:,}) | {_mib(v['weight_bytes'])} | "
            f"{_mib(v['fixed_bytes'])} | {_mib(activations)} | {_mib(v['peak_above_import_bytes'])} | "
            f"{_times(ratio)} | {verdict} | {_training_peak(v, device)} | `{v.get('peak_during', '')}` | {losses} |"
        )
        if tensors:
            tensor_ratio = _times(_ratio(v, full, "tensor_peak_bytes"))
            row += f" {_mib(v['tensor_peak_bytes'])}{f' ({tensor_ratio})' if tensor_ratio else ''} |"
        if device:
            row += f" {_mib(v['device_peak_bytes'])} |"
        rows.append(row)
    return "\n".join(rows)


def _training_peak(variant: dict[str, Any], device: bool) -> str:
    """The run's own peak, logged at the end of its last epoch before ``model.keras`` is written: the device's, or the
    resident memory's above import."""
    logged = variant.get("peak_device_mib_logged" if device else "peak_rss_mib_logged")
    if logged is None:
        return ""
    return _mib(round(logged * 2**20) - (0 if device else variant["import_rss_bytes"]))


def _ratio(variant: dict[str, Any], full: dict[str, Any], key: str) -> float | None:
    """``variant``'s figure ``key`` over full fine-tuning's, where full fine-tuning was measured."""
    return variant[key] / full[key] if key in full else None


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def _mib(count: int) -> str:
    return f"{count / 2**20:,.0f} MiB"


if __name__ == "__main__":
    main()
