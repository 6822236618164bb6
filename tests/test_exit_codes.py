"""One exit-code rule for command-line values, over every command's options.

A value that is wrong whatever the run is a usage error (exit 2), whichever check finds it; a value that is wrong
for this run (a class count, a split the run lacks, a model file it did not keep) is exit 1, as are data and config
problems. Each row is one value on one command; the last test checks that every option of every command has a row,
so a new option gets one.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import pytest

from accumrun import train
from accumrun.cli import main
from tests.helpers import invoke, tiny_config

# Placeholders in a row's arguments: a finished classifier, its config, an input it takes, an existing file, an empty
# folder, a folder that holds a file, a path that does not exist. generate's values are refused before the run is
# read, so the classifier serves there too.
ROWS = [
    # --- the commands that read a config ---
    ("train {config} --epochs 0", 2, "Invalid value for '--epochs'"),
    ("train {config} --batch-size 0", 2, "Invalid value for '--batch-size'"),
    ("train {config} --subdivisions many", 2, "Invalid value for '--subdivisions'"),
    ("train {config} --set epochs", 2, "is not KEY=VALUE"),
    ("train {config} --run-dir {file}", 2, "Invalid value for '--run-dir'"),
    ("train {config} --run-dir {file}/run", 2, "file.txt is a file, not a folder"),
    ("train --resume {empty}", 2, "not a run folder (no run.json)"),
    ("train {config} --set training.epochs=0", 1, "training.epochs: "),
    ("train {config} --set optimizer.amsgrad=maybe", 1, "optimizer.amsgrad: must be true or false"),
    ("train {config} --run-dir {occupied}", 1, "exists and is not empty"),
    ("check {config} --epochs 0", 2, "Invalid value for '--epochs'"),
    ("check {config} --batch-size fulll", 2, "Invalid value for '--batch-size'"),
    ("check {config} --subdivisions 0", 2, "Invalid value for '--subdivisions'"),
    ("check {config} --set x", 2, "is not KEY=VALUE"),
    ("plan {config} --epochs 0", 2, "Invalid value for '--epochs'"),
    ("plan {config} --batch-size 0", 2, "Invalid value for '--batch-size'"),
    ("plan {config} --subdivisions 0", 2, "Invalid value for '--subdivisions'"),
    ("plan {config} --set x", 2, "is not KEY=VALUE"),
    ("plan {config} --memory-budget 6XB", 1, "Error: training.memory_budget: must be a size such as 6GiB"),
    ("plan {config} --precision fp8", 2, "Invalid value for '--precision'"),
    ("plan {config} --remat bogus", 2, "Invalid value for '--remat'"),
    ("plan {config} --json {missing}/plan.json", 2, "Invalid value for '--json': its folder"),
    ("compare {config} --subdivisions 0,1", 2, "Invalid value for '--subdivisions'"),
    ("compare {config} --vary optimizer.name", 2, "Invalid value for '--vary'"),
    ("compare {config} --vary optimizer.name=sgd,sgd", 2, "with two values or more"),
    ("compare {config} --subdivisions 4,4", 2, "'4,4' names one count; a comparison needs two or more"),
    ("compare {config} --epochs 0", 2, "Invalid value for '--epochs'"),
    ("compare {config} --batch-size 0", 2, "Invalid value for '--batch-size'"),
    ("compare {config} --set x", 2, "is not KEY=VALUE"),
    ("compare {config} --run-dir {file}", 2, "Invalid value for '--run-dir'"),
    ("compare {config} --run-dir {file}/out", 2, "file.txt is a file, not a folder"),
    ("compare {config} --run-dir {occupied}", 1, "run_dir: exists and is not empty"),
    ("compare --resume {empty}", 2, "not a comparison's folder (no compare.json)"),
    ("launch --workers 0 {config}", 2, "Invalid value for '--workers'"),
    # launch takes train's options and checks them as train does, before it starts a worker.
    ("launch --workers 2 {config} --epochs 0", 2, "Invalid value for '--epochs'"),
    ("launch --workers 2 {config} --batch-size none", 2, "Invalid value for '--batch-size'"),
    ("launch --workers 2 {config} --subdivisions -1", 2, "Invalid value for '--subdivisions'"),
    ("launch --workers 2 {config} --set x", 2, "is not KEY=VALUE"),
    ("launch --workers 2 {config} --run-dir {file}", 2, "Invalid value for '--run-dir'"),
    ("launch --workers 2 --resume {empty}", 2, "not a run folder (no run.json)"),
    # --- the commands that read a finished run ---
    ("evaluate {run} --split nope", 2, "Invalid value for '--split'"),
    ("evaluate {run} --split test", 1, "split: data.name: synthetic has no test split"),
    ("evaluate {run} --model last", 2, "Invalid value for '--model'"),
    ("evaluate {run} --model best", 1, "model: the run has no model.best.keras"),
    ("evaluate {run} --data {input}", 1, "data: data.name: synthetic reads no file; --data takes a file or folder"),
    ("predict {run} {input} --top-k 0", 2, "Invalid value for '--top-k'"),
    ("predict {run} {input} --top-k 5", 1, "top_k: must be 1 to 3, the run's classes (got 5)"),
    ("predict {run} {input} --lines", 1, "lines: reads lines of text files; this run's model does not take text"),
    ("predict {run} {input} --output {empty}", 2, "Invalid value for '--output'"),
    ("predict {run} {input} --output {file}/p.csv", 2, "file.txt is a file, not a folder"),
    ("predict {run} {input} --output {missing}/p.txt", 2, "p.txt: name a .csv or .json file"),
    ("predict {run} {input} --model last", 2, "Invalid value for '--model'"),
    ("generate {run} --prompt=", 2, "prompt: give the model some text to continue"),
    ("generate {run} --prompt a --max-tokens -5", 2, "Invalid value for '--max-tokens'"),
    ("generate {run} --prompt a --temperature -1", 2, "Invalid value for '--temperature'"),
    ("generate {run} --prompt a --seed -1", 2, "Invalid value for '--seed'"),
    ("generate {run} --prompt a --model last", 2, "Invalid value for '--model'"),
    ("generate {run} --prompt a", 1, "this run's task is classification"),
    ("export {run} --format onnx", 2, "Invalid value for '--format'"),
    ("export {run} --output {file}", 2, "Invalid value for '--output'"),
    ("export {run} --output {file}/saved", 2, "file.txt is a file, not a folder"),
    ("export {run} --output {occupied}", 1, "output: exists; pass --overwrite to replace it"),
    ("export {run} --model best", 1, "model: the run has no model.best.keras"),
    ("plot {empty}", 2, "not a run folder (no run.json) nor a comparison's (no compare.json)"),
    ("plot {run} --out {empty}", 2, "Invalid value for '--out'"),
    ("plot {run} --out {file}/p.png", 2, "file.txt is a file, not a folder"),
    ("plot {run} --out {missing}/p.jpg", 2, "p.jpg: name a .png, .pdf or .svg file"),
    # --- the commands that make data ---
    ("download cifar", 2, "Invalid value for '{mnist|fashion_mnist}'"),
    ("download mnist --to {file}", 2, "Invalid value for '--to'"),
    ("download mnist --to {file}/mnist", 2, "file.txt is a file, not a folder"),
    ("download mnist --to {missing} --base-url mirror.example", 2, "Invalid value for '--base-url'"),
    ("make-example pictures {missing}", 2, "'pictures' is not one of 'images'"),
    ("make-example images {missing} --count 5", 2, "Invalid value for '--count'"),
    ("make-example images {missing} --size 3", 2, "Invalid value for '--size'"),
    ("make-example images {missing} --seed -1", 2, "Invalid value for '--seed'"),
    ("make-example images {file}/shapes", 2, "file.txt is a file, not a folder"),
    ("make-example images {occupied}", 1, "already exists; choose another target or remove it"),
]

FLAGS_ONLY = {"--help", "--memory", "--overwrite", "--no-tensorboard", "--quiet", "--no-subdivisions"}
"""Options that take no value, so that no value of theirs is wrong."""


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The rows' placeholders: a finished 3-class MLP and paths around it."""
    folder = tmp_path_factory.mktemp("exit-codes")
    config = tiny_config(folder)
    train(config, folder / "run", quiet=True)
    np.savez(folder / "input.npz", x=np.zeros((2, 4), np.float32))
    (folder / "file.txt").write_text("a file\n")
    (folder / "empty").mkdir()
    (folder / "occupied").mkdir()
    (folder / "occupied" / "kept.txt").write_text("kept\n")
    paths = {
        "run": folder / "run",
        "config": config,
        "input": folder / "input.npz",
        "file": folder / "file.txt",
        "empty": folder / "empty",
        "occupied": folder / "occupied",
        "missing": folder / "missing",
    }
    return {name: str(path) for name, path in paths.items()}


@pytest.mark.parametrize(("line", "exit_code", "fragment"), ROWS, ids=[line for line, _, _ in ROWS])
def test_a_bad_value_exits_by_the_rule(places: dict[str, str], line: str, exit_code: int, fragment: str) -> None:
    args = [word.format(**places) for word in line.split()]
    result = invoke(*args)
    assert result.returncode == exit_code, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr
    if exit_code == 2:
        assert "Usage: accumrun" in result.stderr  # a usage error shows how the command is called
    assert sum(line.startswith("Error") for line in result.stderr.splitlines()) == 1
    assert not (Path(places["missing"])).exists()  # nothing half-made


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_of_every_command_has_a_row(command: str) -> None:
    options = {
        name
        for parameter in main.commands[command].params
        if isinstance(parameter, click.Option)
        for name in parameter.opts
        if name.startswith("--")
    }
    given = {word.partition("=")[0] for line, _, _ in ROWS if line.split()[0] == command for word in line.split()}
    assert sorted(options - FLAGS_ONLY - given) == []
