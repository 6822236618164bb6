"""``python -m tests.readme_blocks RUNS``: what the code prints now for the README blocks that
tests/test_readme_samples.py checks, as JSON on standard output (``{block: lines}``). Run in a scratch folder made by
``docs/samples.py``'s ``scratch_folder``, in a process of its own: as ``docs/samples.py`` makes the samples, with
Grappler on and oneDNN's custom operations off (see ``samples.SAMPLE_ENVIRONMENT``). Runs go under the folder
``RUNS``."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from accumrun.reports.compare import SUBDIVISIONS, Variant, format_table
from accumrun.rundir.metrics import read_rows
from tests.helpers import REPO, invoke


def load_samples() -> ModuleType:
    """``docs/samples.py``, which makes the README's blocks (not a package: loaded from its path)."""
    path = REPO / "docs" / "samples.py"
    spec = importlib.util.spec_from_file_location("readme_samples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


samples = load_samples()


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


def compared(key: str, variants: list[tuple[int | str, str]], runs: Path) -> list[str]:
    """A comparison's epoch table, from its variants' ``accumrun train`` commands run in this process (as
    ``compare`` runs each in a process of its own: the same commands, the same rows; tests/test_compare.py holds
    that)."""
    trained = []
    for value, command in variants:
        run_dir = runs / f"{key}-{value}"
        fresh_output(f"{command} --quiet --run-dir {run_dir}")
        trained.append(Variant(value, run_dir, key, exit_code=0, metrics=read_rows(run_dir)))
    return samples.first_table(format_table(trained).splitlines())


def whole(lines: list[str]) -> list[str]:
    return lines


# Each checked block: what prints it again now (the README's own command, or the same with fewer epochs where only
# the first rows are checked), and the part of the block that must equal it.
CHECKED: dict[str, tuple[Callable[[Path], list[str]], Callable[[list[str]], list[str]]]] = {
    "digits": (lambda _: as_sample("digits"), whole),
    "noise-scale": (lambda _: as_sample("noise-scale"), whole),
    "compare": (
        lambda runs: compared(
            SUBDIVISIONS,
            [(value, f"train configs/digits.yaml --epochs 3 --subdivisions {value}") for value in (4, 1)],
            runs,
        ),
        samples.first_table,
    ),
    "compare-lbfgs": (
        lambda runs: compared(
            "optimizer.name",
            [
                (name, f"train configs/digits_mlp_fullbatch.yaml --epochs 3 --set optimizer.name={name}")
                for name in ("adam", "lbfgs")
            ],
            runs,
        ),
        lambda block: block[:4],
    ),
}


if __name__ == "__main__":
    runs = Path(sys.argv[1])
    print(json.dumps({block: printed_now(runs) for block, (printed_now, _) in CHECKED.items()}))
