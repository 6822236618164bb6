"""The README's cheap, deterministic samples equal what the code prints now, to the printed digit: the default
digits run, the noise scale's rows and closing line, and the first rows of the subdivisions and the L-BFGS
comparisons. Only what a rerun changes (seconds, samples/s, the run folder's timestamp) is masked. The samples are
made by ``docs/samples.py``, which rewrites the blocks when the code's output changes."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import invoke


def load_samples() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "docs" / "samples.py"
    spec = importlib.util.spec_from_file_location("readme_samples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


samples = load_samples()
RERUN_CHANGES = re.compile(r"\d[\d,]*(?:\.\d+)? s\b|[\d,]+ samples/s|\d{8}-\d{6}")
"""Seconds, rates and a run folder's timestamp: all a rerun changes in these samples."""


def steady(lines: list[str]) -> list[str]:
    return [RERUN_CHANGES.sub("#", line) for line in lines]


def whole(lines: list[str]) -> list[str]:
    return lines


# Each checked block: the command that reprints it (the README's own, or the same with fewer epochs where only the
# first rows are checked), and the part of the block and of the fresh output that must be equal.
CHECKED: dict[str, tuple[str, Callable[[list[str]], list[str]], Callable[[list[str]], list[str]]]] = {
    "digits": ("train configs/digits.yaml", lambda out: samples.shortened(out, 9, 2, "epochs"), whole),
    "noise-scale": (samples.NOISE_SCALE, lambda out: samples.epoch_rows(out, 2, 2), whole),
    "compare": ("compare configs/digits.yaml --epochs 3", samples.first_table, samples.first_table),
    "compare-lbfgs": (
        "compare configs/digits_mlp_fullbatch.yaml --vary optimizer.name=adam,lbfgs --epochs 3",
        samples.first_table,
        lambda block: block[:4],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("block", list(CHECKED))
def test_the_readme_sample_is_what_the_code_prints(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command, fresh_part, block_part = CHECKED[block]
    shown = samples.readme_blocks(samples.README.read_text())[block]
    monkeypatch.chdir(samples.scratch_folder(tmp_path))
    result = invoke(*shlex.split(command))
    assert result.returncode == 0, result.stderr
    fresh = fresh_part(result.stdout.rstrip("\n").splitlines())
    assert steady(fresh) == steady(block_part(shown)), f"README block {block} is stale: python docs/samples.py"


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
