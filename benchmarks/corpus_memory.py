"""Benchmark a text corpus's memory as it grows: peak RSS of one epoch over a corpus of A MiB and of 16A MiB, with
``data.cache: disk`` (tokenized once into a token file, each window read from it as the epoch reaches it) and, for
contrast, ``data.cache: none`` (the windows held as arrays).

Every measurement runs in a fresh child process (this script again, with ``--child``), one after another, so each
peak RSS is one run's own: the child's ``ru_maxrss`` once it is done, for the whole process, TensorFlow included.
This process imports neither TensorFlow nor NumPy. Each child loads the corpus with
:func:`accumrun.data.dataset.load_dataset` (a disk child into a fresh cache folder, so its peak covers
tokenizing the corpus into its token file) and then reads one epoch of windows through
:class:`accumrun.data.feeder.Feeder`, the path training takes, at batch ``--batch`` in the seed's order; with
``--train``, it trains a 1-layer transformer for the epoch through ``accumrun.train`` instead (slower: the model's
memory does not grow with the corpus, the data's does).

With ``--tokens``, the same text is written as a flat file of uint16 ids (its bytes, ``vocabulary_size: 256``) and
read through ``data.name: tokens`` instead, whose target is at most 20 MiB more peak RSS at 16x the file.

The corpus: byte tokens, ``--sequence-length`` 128, windows that do not overlap; files of about 1 MiB of simple
English sentences, one a line (``accumrun.data.examples.write_corpus``'s, joined), as many as the size needs.
Target: the 16A corpus on disk costs less than 100 MiB more than the A corpus on disk. Run from anywhere:

    python benchmarks/corpus_memory.py [--size-mib A] [--batch B] [--train] [--skip-none] [--tokens] [--output PATH]

The Markdown report goes to stdout, progress to stderr, every figure to the JSON ``--output``.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GROWTH = 16
MAX_GROWTH_MIB = {"disk": 100, "tokens": 20}
FILE_BYTES = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=4.0, help="A: the smaller corpus's size in MiB")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--train", action="store_true", help="train a tiny transformer for the epoch")
    parser.add_argument("--skip-none", action="store_true", help="measure data.cache: disk alone")
    parser.add_argument("--tokens", action="store_true", help="measure data.name: tokens on the text's bytes instead")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--child", choices=("none", "disk", "tokens"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="corpus-memory-") as scratch:
        work = Path(scratch)
        for size in (args.size_mib, args.size_mib * GROWTH):
            corpus = _write_corpus(work / f"corpus-{size:g}", int(size * (1 << 20)))
            if args.tokens:
                corpus = _write_token_file(corpus)
            modes = ("tokens",) if args.tokens else ("disk",) if args.skip_none else ("disk", "none")
            for mode in modes:
                print(f"{mode} at {size:g} MiB ...", file=sys.stderr, flush=True)
                figures = _run_child(args, mode, corpus, work / f"cache-{size:g}", work / "result.json")
                results.append({"mode": mode, "size_mib": size, **figures})
    print(_report(results, args))
    if args.output is not None:
        args.output.write_text(json.dumps({"results": results, **vars(args)}, default=str, indent=1) + "\n")


def _write_corpus(folder: Path, size: int) -> Path:
    """Files of about :data:`FILE_BYTES` of sentences, one a line, ``size`` bytes in all."""
    sys.path.insert(0, str(REPO))
    from accumrun.data.examples import write_corpus

    sentences = folder.parent / "sentences"
    if not sentences.exists():
        write_corpus(sentences, 200, seed=0)
    paragraphs = [path.read_text().replace(". ", ".\n") for path in sorted(sentences.glob("*.txt"))]
    text = "\n".join(line for paragraph in paragraphs for line in paragraph.split("\n") if line) + "\n"
    folder.mkdir()
    written, index = 0, 0
    while written < size:
        count = min(FILE_BYTES, size - written)
        repeated = (text * (count // len(text) + 1))[:count]
        # Rotate the text per file, so that the files differ.
        shift = (index * 7919) % len(text)
        (folder / f"{index:05d}.txt").write_text((text[shift:] + text[:shift] + repeated)[:count])
        written += count
        index += 1
    return folder


def _write_token_file(corpus: Path) -> Path:
    """The corpus's bytes as one flat file of little-endian uint16 ids (nanoGPT's ``train.bin``), beside it."""
    path = corpus.with_suffix(".bin")
    with path.open("wb") as out:
        for text in sorted(corpus.glob("*.txt")):
            ids = array.array("H")
            ids.extend(text.read_bytes())  # one id per byte
            if sys.byteorder != "little":
                ids.byteswap()
            out.write(ids.tobytes())
    return path


def _run_child(args: argparse.Namespace, mode: str, corpus: Path, cache: Path, result: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", mode, "--corpus", str(corpus), "--cache-dir", str(cache)]
    command += ["--result", str(result), "--sequence-length", str(args.sequence_length), "--batch", str(args.batch)]
    command += ["--train"] if args.train else []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run(command, check=True, capture_output=True, cwd=REPO, env=env)
    figures: dict[str, Any] = json.loads(result.read_text())
    return figures


def _child(args: argparse.Namespace) -> None:
    """Load the corpus and read (or train) one epoch; write the figures and the peak RSS to ``args.result``."""
    sys.path.insert(0, str(REPO))
    from accumrun import train
    from accumrun.config.schema import data_config
    from accumrun.core.sub_batches import batch_sizes
    from accumrun.data.dataset import load_dataset
    from accumrun.data.feeder import Feeder

    section: dict[str, Any] = {
        "path": str(args.corpus),
        "sequence_length": args.sequence_length,
        "validation_split": 0.0,
    }
    if args.child == "tokens":
        section.update(name="tokens", vocabulary_size=256)
    else:
        section.update(name="text_corpus", cache=args.child, cache_dir=str(args.cache_dir))
    begun = time.perf_counter()
    windows, tokens = 0, 0
    if args.train:
        config = {
            "seed": 0,
            "data": section,
            "model": {"name": "transformer", "layers": 1, "heads": 2, "width": 16},
            "training": {"epochs": 1, "batch_size": args.batch, "subdivisions": 4},
            "optimizer": {"name": "sgd", "learning_rate": 0.1},
            "output": {"tensorboard": False},
        }
        train(config, args.cache_dir.parent / f"run-{args.child}-{args.corpus.name}", quiet=True)
        loaded = epoch = time.perf_counter() - begun
    else:
        split = load_dataset(data_config(**section), 0).train
        loaded = time.perf_counter() - begun
        feeder = Feeder(split, batch_sizes(split.size, args.batch), seed=0, shuffle=True)
        for _, y in feeder.epoch(0):
            windows += int(y.shape[0])
            tokens += int((y.numpy() != 0).sum())
        epoch = time.perf_counter() - begun - loaded
    args.result.write_text(
        json.dumps(
            {
                "windows": windows,
                "real_tokens": tokens,
                "load_seconds": loaded,
                "epoch_seconds": epoch,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def _report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"## Corpus memory (sequence length {args.sequence_length}, batch {args.batch}, "
        f"{'training' if args.train else 'reading'} one epoch)",
        "",
        "| source | text MiB | windows | load s | epoch s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        windows = f"{r['windows']:,}" if r["windows"] else "-"  # a training child counts none
        lines.append(
            f"| {r['mode']} | {r['size_mib']:g} | {windows} | {r['load_seconds']:.1f} | "
            f"{r['epoch_seconds']:.1f} | {r['peak_rss_mib']:,.0f} |"
        )
    lines += ["", "| target | measured | result |", "|---|---:|---|"]
    for mode, limit in MAX_GROWTH_MIB.items():
        peaks = [r["peak_rss_mib"] for r in results if r["mode"] == mode]
        if len(peaks) == 2:
            growth = peaks[1] - peaks[0]
            met = "met" if growth <= limit else "NOT met"
            lines.append(
                f"| {mode}: {GROWTH}x the data costs <= {limit} MiB more peak RSS | {growth:+.0f} MiB | {met} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
