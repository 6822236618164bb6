"""The README's sample outputs, made by running what they show, so that none can go stale.

``python docs/samples.py`` runs every sample's commands, each sample in a scratch folder of its own (the repository's
``configs/`` and bundled ``datasets/`` linked in), and rewrites each block of README.md that sits between
``<!-- sample NAME -->`` and ``<!-- /sample -->`` with what the commands print now (standard output: the progress
bars go to standard error). ``python docs/samples.py NAME ...`` reruns those samples alone; ``--list`` names them.
``tests/test_readme_samples.py`` reruns the cheap, deterministic ones and holds the README to the printed digit up to
the end of each run's first epoch: another CPU rounds later epochs otherwise.

A block shortened to its first and last lines says how many it left out.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- sample (?P<name>[\w-]+) -->\n```\n)(?P<body>.*?)(```\n<!-- /sample -->)", re.S)

SAMPLE_ENVIRONMENT = {"TF_ENABLE_ONEDNN_OPTS": "0", "COLUMNS": "200"}
"""What every sample's commands run with besides the caller's environment. TensorFlow turns oneDNN's custom
operations on by itself only on CPUs with AVX-512 VNNI and newer, and their kernels round otherwise, so that even the
first epoch prints other digits there: with them off, the first epoch prints the same digits on every CPU measured
(later epochs still differ between CPUs; see tests/test_readme_samples.py). Wide enough that no line wraps."""


Outputs = list[list[str]]
"""Each command's standard output, as lines, in the order the commands ran."""


@dataclass(frozen=True)
class Sample:
    """Commands run one after another in one folder (as typed after ``accumrun``), and the README blocks made from
    their outputs: each block's name, and the lines it shows."""

    commands: tuple[str, ...]
    blocks: dict[str, Callable[[Outputs], list[str]]]


def shortened(lines: Sequence[str], head: int, tail: int, what: str = "lines") -> list[str]:
    """The first ``head`` and the last ``tail`` lines, and between them a line that says how many were left out."""
    if len(lines) <= head + tail + 1:
        return list(lines)
    return [*lines[:head], f"... ({len(lines) - head - tail} {what} left out)", *lines[len(lines) - tail :]]


def starting(lines: Sequence[str], prefix: str) -> list[str]:
    """The lines from the first that starts with ``prefix``."""
    first = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    return list(lines[first:])


def first_table(lines: Sequence[str]) -> list[str]:
    """A comparison's first table: its header and its rows, up to the first empty line."""
    table = starting(lines, "        epoch |")
    return table[: table.index("")] if "" in table else table


def shown(*commands: tuple[str, list[str]]) -> list[str]:
    """Commands with what they print, as a terminal shows them."""
    return [line for command, output in commands for line in (f"$ accumrun {command}", *output)]


def epoch_rows(output: list[str], head: int, tail: int) -> list[str]:
    """A run's epoch rows and what follows them, shortened to the first and the last."""
    return shortened(starting(output, "epoch 1/"), head, tail)


NOISE_SCALE = "train configs/digits.yaml --set 'training.measure=[noise_scale]' --epochs 5"
SHAPES = ("evaluate runs/shapes", "predict runs/shapes new-shapes --top-k 2", "export runs/shapes")
CHAR_LM_GENERATE = 'generate runs/char_lm --prompt "MENENIUS:" --max-tokens 200 --temperature 0.7'
STARTUP_OF_REPLICAS = ("distribute", "data", "model", "batch")
WORD_PIECE = "'data.tokenizer={name: word_piece, vocabulary_size: 300}'"

SAMPLES: dict[str, Sample] = {
    "digits": Sample(("train configs/digits.yaml",), {"digits": lambda out: shortened(out[0], 9, 2, "epochs")}),
    "compare": Sample(("compare configs/digits.yaml --epochs 3",), {"compare": lambda out: out[0]}),
    "noise-scale": Sample((NOISE_SCALE,), {"noise-scale": lambda out: epoch_rows(out[0], 2, 3)}),
    "lbfgs": Sample(
        (
            "train configs/digits_mlp_fullbatch.yaml --run-dir runs/mlp-adam",
            "train configs/lbfgs_polish.yaml --run-dir runs/mlp-lbfgs",
            "compare configs/digits_mlp_fullbatch.yaml --vary optimizer.name=adam,lbfgs",
        ),
        {
            "lbfgs-polish": lambda out: shortened(starting(out[1], "optimizer lbfgs"), 4, 2, "epochs"),
            "compare-lbfgs": lambda out: shortened(first_table(out[2]), 4, 1, "rows"),
        },
    ),
    "shapes": Sample(
        (
            "make-example images datasets/shapes",
            "train configs/image_folder.yaml --run-dir runs/shapes -q",
            "make-example images new-shapes --count 6 --seed 9",
            *SHAPES,
            "check configs/image_folder.yaml",
        ),
        {
            "shapes": lambda out: shown(*zip(SHAPES, out[3:6], strict=True)),
            "image-feed": lambda out: [line for line in out[6] if line.startswith("input ")],
        },
    ),
    "draws": Sample(
        ("check configs/digits.yaml --set 'model={name: mlp, hidden: [64], dropout: 0.2}'",),
        {"draws": lambda out: [line for line in out[0] if line.startswith("random layers")]},
    ),
    "char-lm": Sample(
        ("train configs/char_lm.yaml --run-dir runs/char_lm", CHAR_LM_GENERATE),
        {"char-lm": lambda out: out[0], "char-lm-generate": lambda out: out[1]},
    ),
    "word-piece-export": Sample(
        (
            "make-example text datasets/reviews",
            f"train configs/text_classification.yaml --set {WORD_PIECE} --epochs 1 --run-dir runs/x -q",
            "export runs/x",
        ),
        {"word-piece-export": lambda out: out[2]},
    ),
    "mirrored": Sample(
        ("train configs/digits.yaml --set distribute.strategy=mirrored --set distribute.logical_cpus=2",),
        {"mirrored": lambda out: [line for line in out[0] if line.startswith(STARTUP_OF_REPLICAS)]},
    ),
}


def scratch_folder(parent: Path) -> Path:
    """A folder to run in, as a fresh clone is: the configs, and the bundled data files (not the folders that
    examples are made into)."""
    (parent / "datasets").mkdir(parents=True)
    for item in (ROOT / "datasets").iterdir():
        if item.is_file() and not item.name.startswith("."):
            (parent / "datasets" / item.name).symlink_to(item)
    (parent / "configs").symlink_to(ROOT / "configs")
    return parent


def run_commands(commands: Sequence[str], folder: Path) -> Outputs:
    """Run each command as ``accumrun`` in ``folder``; their standard output, as lines.

    Raises:
        RuntimeError: a command failed (its standard error says why).
    """
    outputs = []
    for command in commands:
        argv = [sys.executable, "-m", "accumrun", *shlex.split(command)]
        done = subprocess.run(
            argv, cwd=folder, capture_output=True, text=True, env={**os.environ, **SAMPLE_ENVIRONMENT}
        )
        if done.returncode != 0:
            raise RuntimeError(f"accumrun {command} exited {done.returncode}:\n{done.stderr}")
        outputs.append(done.stdout.rstrip("\n").splitlines())
    return outputs


def blocks_of(name: str) -> dict[str, list[str]]:
    """Run sample ``name`` in a scratch folder; the README blocks it makes."""
    sample = SAMPLES[name]
    with tempfile.TemporaryDirectory(prefix=f"accumrun-sample-{name}-") as scratch:
        outputs = run_commands(sample.commands, scratch_folder(Path(scratch)))
    return {block: excerpt(outputs) for block, excerpt in sample.blocks.items()}


def readme_blocks(text: str) -> dict[str, list[str]]:
    """The README's sample blocks by name, as lines."""
    return {match["name"]: match["body"].rstrip("\n").splitlines() for match in BLOCK.finditer(text)}


def rewritten(text: str, blocks: dict[str, list[str]]) -> str:
    """``text`` with each named block's lines replaced.

    Raises:
        KeyError: a block has no marked place in the text.
    """
    missing = set(blocks) - set(readme_blocks(text))
    if missing:
        raise KeyError(f"README.md marks no block {', '.join(sorted(missing))}")

    def body(match: re.Match[str]) -> str:
        lines = blocks.get(match["name"])
        if lines is None:
            return match.group(0)
        return match.group(1) + "".join(f"{line}\n" for line in lines) + match.group(4)

    return BLOCK.sub(body, text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="samples to rerun (default: all)")
    parser.add_argument("--list", action="store_true", help="name the samples and their blocks")
    args = parser.parse_args(argv)
    if args.list:
        for name, sample in SAMPLES.items():
            print(f"{name}: {', '.join(sample.blocks)}")
        return
    unknown = set(args.names) - set(SAMPLES)
    if unknown:
        parser.error(f"unknown samples {', '.join(sorted(unknown))}; known: {', '.join(SAMPLES)}")
    for name in args.names or SAMPLES:
        print(f"running {name} ...", flush=True)
        README.write_text(rewritten(README.read_text(), blocks_of(name)))
        print(f"rewrote {', '.join(SAMPLES[name].blocks)}", flush=True)


if __name__ == "__main__":
    main()
