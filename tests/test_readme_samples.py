"""The README's cheap, deterministic samples equal what the code prints now, to the printed digit: the default
digits run, the noise scale's rows and closing line, and the first rows of the subdivisions and the L-BFGS
comparisons. Only what a rerun changes (seconds, samples/s, the run folder's timestamp) is masked. The samples are
made by ``docs/samples.py``, which rewrites the blocks when the code's output changes."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from accumrun.reports.compare import SUBDIVISIONS, Variant, format_table
from accumrun.rundir.metrics import read_rows
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


@pytest.fixture(autouse=True)
def as_a_user_runs_it() -> Iterator[None]:
    """Grappler on, as in ``accumrun`` and ``docs/samples.py`` (tests/conftest.py turns it off): its rewrites round
    otherwise, and 20 epochs of training carry a last-place difference into the printed digits."""
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
    yield
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


RERUN_CHANGES = re.compile(r"\d[\d,]*(?:\.\d+)? s\b|[\d,]+ samples/s|\d{8}-\d{6}")
"""Seconds, rates and a run folder's timestamp: all a rerun changes in these samples."""


def steady(lines: list[str]) -> list[str]:
    return [RERUN_CHANGES.sub("#", line) for line in lines]


def whole(lines: list[str]) -> list[str]:
    return lines


def fresh_output(command: str) -> list[str]:
    """What ``accumrun COMMAND`` prints, run in this process."""
    result = invoke(*shlex.split(command))
    assert result.returncode == 0, result.stderr
    return result.stdout.rstrip("\n").splitlines()


def as_sample(name: str) -> list[str]:
    """Sample ``name``'s one block, from its one command run in this process."""
    sample = samples.SAMPLES[name]
    (command,) = sample.commands
    return sample.blocks[name]([fresh_output(command)])


def compared(key: str, variants: list[tuple[int | str, str]], folder: Path) -> list[str]:
    """A comparison's epoch table, from its variants' ``accumrun train`` commands run in this process (as
    ``compare`` runs each in a process of its own: the same commands, the same rows; tests/test_compare.py holds
    that)."""
    trained = []
    for value, command in variants:
        run_dir = folder / f"{key}-{value}"
        fresh_output(f"{command} --quiet --run-dir {run_dir}")
        trained.append(Variant(value, run_dir, key, exit_code=0, metrics=read_rows(run_dir)))
    return samples.first_table(format_table(trained).splitlines())


# Each checked block: what prints it again now (the README's own command, or the same with fewer epochs where only
# the first rows are checked), and the part of the block that must equal it.
CHECKED: dict[str, tuple[Callable[[Path], list[str]], Callable[[list[str]], list[str]]]] = {
    "digits": (lambda _: as_sample("digits"), whole),
    "noise-scale": (lambda _: as_sample("noise-scale"), whole),
    "compare": (
        lambda folder: compared(
            SUBDIVISIONS,
            [(value, f"train configs/digits.yaml --epochs 3 --subdivisions {value}") for value in (4, 1)],
            folder,
        ),
        samples.first_table,
    ),
    "compare-lbfgs": (
        lambda folder: compared(
            "optimizer.name",
            [
                (name, f"train configs/digits_mlp_fullbatch.yaml --epochs 3 --set optimizer.name={name}")
                for name in ("adam", "lbfgs")
            ],
            folder,
        ),
        lambda block: block[:4],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("block", list(CHECKED))
def test_the_readme_sample_is_what_the_code_prints(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    printed_now, block_part = CHECKED[block]
    shown = samples.readme_blocks(samples.README.read_text())[block]
    monkeypatch.chdir(samples.scratch_folder(tmp_path / "scratch"))
    fresh = printed_now(tmp_path / "runs")
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
