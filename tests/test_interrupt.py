"""Ctrl-C at any moment of a command exits 130, with no traceback and not click's ``Aborted!`` (exit 1, which means
bad input): a real ``accumrun train`` process is signalled at several moments of its start, and the group's edge is
checked in this process."""

from __future__ import annotations

import configparser
import signal
from pathlib import Path
from typing import IO

import click
import pytest

from tests.helpers import REPO, invoke, start_paused, tiny_config


def _read_until(stream: IO[str], marker: str) -> list[str]:
    """The lines of ``stream`` up to the first whose last ``|``-separated field is ``marker`` (all, if none is)."""
    lines = []
    for line in stream:
        lines.append(line.split("|")[-1].strip())
        if lines[-1] == marker:
            break
    return lines


# Where the signal lands: -X importtime writes a line to stderr as each import ends. click ends while the command
# line is being imported (nothing of accumrun's own ran yet but the package and __main__); the config's loader
# while the config resolves, before TensorFlow starts; the first line of output once TensorFlow has started and
# the run is set up.
MOMENTS = {
    "while the command line imports": ("stderr", "click"),
    "while the config resolves, before TensorFlow": ("stderr", "accumrun.config.loading"),
    "after the first line of output": ("stdout", "run dir run"),
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_at_any_moment_of_trains_start_exits_130(tmp_path: Path, moment: str) -> None:
    # Each forward pass pauses 0.1 s, so that the run is still training when the last moment's signal comes.
    config = tiny_config(tmp_path, model={"name": "tests.hook_models:mlp", "hidden": [8]}, training={"epochs": 20})
    process = start_paused(["-X", "importtime", "-m", "accumrun", "train", str(config), "--run-dir", "run"], tmp_path)
    try:
        stream, marker = MOMENTS[moment]
        seen = _read_until(process.stdout if stream == "stdout" else process.stderr, marker)  # type: ignore[arg-type]
        assert seen[-1:] == [marker], seen
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    said = [line for line in stderr.splitlines() if line.strip() and not line.startswith("import time:")]
    assert process.returncode == 130, said
    assert not any("Traceback" in line or "Aborted" in line for line in said), said
    if stream == "stderr":  # nothing was written yet, and there is nothing to resume
        assert said == ["stopped by Ctrl-C"]
        assert not (tmp_path / "run").exists()
    else:  # stopped before training began, or at a batch boundary with a checkpoint
        assert said[-1] in {"stopped before the first checkpoint; nothing to resume"} or said[-1].startswith(
            "resume with: "
        ), said


def test_ctrl_c_in_a_command_is_exit_130_not_aborted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The group's edge, in this process: a KeyboardInterrupt from a command's body, or while the arguments are
    # parsed (a run folder's check reads its files), is "stopped by Ctrl-C" and 130.
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("accumrun.cli.train.start_tensorflow", interrupted)
    result = invoke("train", str(tiny_config(tmp_path)), "--run-dir", str(tmp_path / "run"))
    assert (result.returncode, result.stderr) == (130, "\nstopped by Ctrl-C\n")
    monkeypatch.setattr("accumrun.rundir.layout.require_run_folder", interrupted)
    result = invoke("evaluate", str(tmp_path))
    assert (result.returncode, result.stderr) == (130, "\nstopped by Ctrl-C\n")
    monkeypatch.setattr(click.Group, "parse_args", interrupted)  # the group's own, before a command is chosen
    result = invoke("evaluate", str(tmp_path))
    assert (result.returncode, result.stderr) == (130, "\nstopped by Ctrl-C\n")


def test_the_console_command_enters_where_ctrl_c_is_caught_from_its_first_line() -> None:
    # The console script imports its entry point's module before calling it: accumrun.__main__ imports nothing of
    # the command line until main() guards that import; accumrun.cli would be half a second of Aborted-free
    # tracebacks.
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert setup["options.entry_points"]["console_scripts"].strip() == "accumrun = accumrun.__main__:main"
