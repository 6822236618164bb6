"""Options declared once and passed on: ``launch`` gives each worker the train options it was given, a lost chief
makes the launcher exit 75, and a bad argument of an API call shows as a usage error of its command."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import accumrun.launcher
from accumrun.cli import main
from tests.helpers import tiny_config


def test_launch_passes_the_train_options_it_was_given_to_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: dict[str, Any] = {}

    def launch(workers: int, args: Sequence[str], echo: Any, grace_seconds: float) -> int:
        started.update(workers=workers, args=list(args), grace_seconds=grace_seconds)
        return 0

    monkeypatch.setattr(accumrun.launcher, "launch", launch)
    path = tiny_config(tmp_path)
    options = ["--epochs", "3", "--set", "seed=2", "--set", "training.subdivisions=2", "-q", "--no-subdivisions"]
    result = CliRunner().invoke(main, ["launch", "--workers", "2", str(path), *options, "--run-dir", "out"])
    assert result.exit_code == 0, result.output
    # Parsed by click as train parses them, then given on in train's own spelling; what was left out stays out.
    assert started["workers"] == 2
    assert started["args"] == [
        str(path),
        "--no-subdivisions",
        "--epochs=3",
        "--set=seed=2",
        "--set=training.subdivisions=2",
        "--run-dir=out",
        "--quiet",
        "--set=distribute.strategy=multi_worker",
    ]
    assert started["grace_seconds"] == 300 + 30  # the default distribute.timeout_seconds, and time to notice


def test_launch_refuses_what_train_refuses(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["launch", "--workers", "2"])
    assert result.exit_code == 2 and "Usage: main launch" in result.output
    assert "missing CONFIG (or --resume RUN_DIR to continue a run)" in result.output
    result = CliRunner().invoke(main, ["launch", "--workers", "2", str(tiny_config(tmp_path)), "--epoch", "3"])
    assert result.exit_code == 2 and "Did you mean '--epochs'?" in result.output


@pytest.mark.parametrize(
    ("script", "expected", "message"),
    [
        ("exit 3", 3, "[launch] exit statuses [3]; worker 0's is the launcher's"),
        ("kill -9 $$", 75, "[launch] exit statuses [-9]; worker 0 was lost, so the launcher's is 75"),
    ],
)
def test_launch_exits_with_the_chief_status_or_75_when_the_chief_is_lost(
    script: str, expected: int, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for the Python interpreter that each worker runs: it exits, or is killed, at once.
    worker = tmp_path / "worker"
    worker.write_text(f"#!/bin/sh\n{script}\n")
    worker.chmod(worker.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(accumrun.launcher.sys, "executable", str(worker))
    lines: list[str] = []
    assert accumrun.launcher.launch(1, [], lines.append, grace_seconds=1) == expected
    assert lines[-1] == message


def test_a_bad_argument_of_the_api_is_a_usage_error_with_the_usage_line(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, training={"subdivisions": 1})
    result = CliRunner().invoke(main, ["compare", str(config), "--run-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.startswith("Usage: main compare [OPTIONS] [CONFIG]")
    assert "Error: subdivisions: the config trains with subdivisions 1; name the counts to compare" in result.output
    assert not (tmp_path / "out").exists()
