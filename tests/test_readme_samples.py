"""The README's cheap, deterministic samples equal what the code prints now: the default digits run, the noise
scale's rows and closing line, and the first rows of the subdivisions and the L-BFGS comparisons. What a rerun
changes (seconds, samples/s, the run folder's timestamp) is masked, and so is what the CPU's rounding changes: every
number after a run's first epoch. Everything up to the end of the first epoch is held to the printed digit, and the
words of every line. The samples are made by ``docs/samples.py``, which rewrites the blocks when the code's output
changes; tests/readme_blocks.py prints them again, in a process that runs as ``docs/samples.py``'s commands run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import child_import_path
from tests.readme_blocks import CHECKED, samples

RERUN_CHANGES = re.compile(r"\d[\d,]*(?:\.\d+)? s\b|[\d,]+ samples/s|\d{8}-\d{6}")
"""Seconds, rates and a run folder's timestamp: all a rerun changes in these samples."""


FIRST_EPOCH = re.compile(r"epoch 1/\d+ \||\s+1 \|")
"""A run's first epoch row: its log line, or a comparison table's row."""

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?")


def steady(lines: list[str]) -> list[str]:
    """``lines`` with what a rerun changes masked, and every number after the first epoch's row. Only up to there do
    the digits hold on every CPU measured: the machine the README's samples were made on, and a 2-core AMD EPYC with
    AVX-512. With oneDNN's custom operations off on both, the first epoch's rows were equal to the digit and the
    second's were not: the two CPUs round the same sums otherwise, and training carries that into the printed digits
    within an epoch."""
    first = next((i for i, line in enumerate(lines) if FIRST_EPOCH.match(line)), len(lines))
    held = [RERUN_CHANGES.sub("#", line) for line in lines[: first + 1]]
    return held + [NUMBER.sub("#", line) for line in lines[first + 1 :]]


@pytest.fixture(scope="module")
def printed_now(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Every checked block as the code prints it now, from one process of its own: this one runs with Grappler off
    (tests/conftest.py), and TensorFlow may have turned oneDNN's custom operations on in it, where the samples are
    made with them off (``samples.SAMPLE_ENVIRONMENT``). Either rounds otherwise, and within an epoch training carries
    that into the printed digits."""
    folder = tmp_path_factory.mktemp("readme")
    done = subprocess.run(
        [sys.executable, "-m", "tests.readme_blocks", str(folder / "runs")],
        cwd=samples.scratch_folder(folder / "scratch"),
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            **samples.SAMPLE_ENVIRONMENT,
            "PYTHONPATH": child_import_path(),
        },
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("block", list(CHECKED))
def test_the_readme_sample_is_what_the_code_prints(block: str, printed_now: dict[str, list[str]]) -> None:
    _, block_part = CHECKED[block]
    shown = samples.readme_blocks(samples.README.read_text())[block]
    assert steady(printed_now[block]) == steady(block_part(shown)), (
        f"README block {block} is stale: python docs/samples.py"
    )


def test_every_sample_block_is_marked_once_and_made_by_a_sample() -> None:
    text = samples.README.read_text()
    marked = re.findall(r"<!-- sample ([\w-]+) -->", text)
    made = [block for sample in samples.SAMPLES.values() for block in sample.blocks]
    assert sorted(marked) == sorted(made) and len(set(marked)) == len(marked)
    assert text.count("<!-- /sample -->") == len(marked) == len(samples.readme_blocks(text))
    assert set(CHECKED) <= set(made)


def test_a_shortened_block_says_how_much_it_left_out() -> None:
    lines = [f"epoch {i}/20" for i in range(1, 21)]
    assert samples.shortened(lines, 2, 1, "epochs") == [
        "epoch 1/20",
        "epoch 2/20",
        "... (17 epochs left out)",
        "epoch 20/20",
    ]
    assert samples.shortened(lines[:4], 2, 1) == lines[:4]
    text = "a\n<!-- sample x -->\n```\nold\n```\n<!-- /sample -->\nb\n"
    assert (
        samples.rewritten(text, {"x": ["new", "lines"]})
        == "a\n<!-- sample x -->\n```\nnew\nlines\n```\n<!-- /sample -->\nb\n"
    )
    with pytest.raises(KeyError, match="marks no block y"):
        samples.rewritten(text, {"y": []})


def test_the_first_epochs_digits_are_held_and_later_ones_are_not() -> None:
    log = [
        "batch 64",
        "epoch 1/3 | loss 0.5802 | 6.9 s",
        "epoch 2/3 | loss 0.1316 | 0.5 s",
        "done: best 0.1316 at epoch 2",
    ]
    table = ["        epoch |      loss S=4", "            1 |      0.580166", "            2 |      0.131631"]
    assert steady(log) == [
        "batch 64",
        "epoch 1/3 | loss 0.5802 | #",
        "epoch #/# | loss # | # s",
        "done: best # at epoch #",
    ]
    assert steady(table) == ["        epoch |      loss S=4", "            1 |      0.580166", "            # |      #"]
