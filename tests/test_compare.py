"""`accumrun compare` and `accumrun plot` on the command line (compare trains each variant in a process of its own;
here they run in this process, see :func:`variants_in_this_process`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.image
import pytest

from accumrun.reports import compare
from tests.helpers import invoke, tiny_config


def variants_in_this_process(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Run each variant's ``accumrun train`` command in this process instead of a fresh interpreter (one
    TensorFlow start, not one per variant): the comparison sees its exit code and stderr as from a process. That
    the variants really run as processes, the comparison in a process too, is the real comparison's of
    tests/test_compare_resume.py (Ctrl-C at a terminal). Returns the commands run."""
    commands: list[list[str]] = []

    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert command[:3] == [sys.executable, "-m", "accumrun"] and kwargs == {"stderr": subprocess.PIPE, "text": True}
        commands.append(command)
        result = invoke(*command[3:])
        return subprocess.CompletedProcess(command, result.returncode, None, result.stderr)

    # The comparison's own name for the module, so that nothing else in this process loses subprocess.run.
    monkeypatch.setattr(compare, "subprocess", SimpleNamespace(run=run, PIPE=subprocess.PIPE))
    return commands


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """One comparison of the config's subdivisions (auto, which settles on 3) vs 1 on a BatchNorm-free model,
    shared by the tests below, its variants run in this process."""
    folder = tmp_path_factory.mktemp("compare")
    # 22 samples: 20 to train on, two whole batches, so each variant traces its step for one batch size.
    config = tiny_config(folder, data={"samples": 22}, training={"subdivisions": "auto", "max_sub_batch": 4})
    with pytest.MonkeyPatch.context() as monkeypatch:
        commands = variants_in_this_process(monkeypatch)
        result = invoke("compare", str(config), "--run-dir", str(folder / "out"))
    assert len(commands) == 2
    return folder / "out", result


@pytest.mark.slow
def test_compare_without_batchnorm_gives_identical_variants(compared: tuple[Path, object]) -> None:
    out, result = compared
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "compare.json").read_text())
    on, off = report["variants"]
    assert (on["subdivisions"], off["subdivisions"]) == ("auto", 1)
    assert on["status"] == off["status"] == "completed"
    assert [row["subdivisions"] for row in on["metrics"]] == [3, 3]
    assert len(on["metrics"]) == len(off["metrics"]) == 2
    for row_on, row_off in zip(on["metrics"], off["metrics"], strict=True):
        assert row_on["loss"] == pytest.approx(row_off["loss"], abs=1e-5)
        assert row_on["val_loss"] == pytest.approx(row_off["val_loss"], abs=1e-5)
    assert off["max_weight_difference"] < 1e-5
    assert "max |d weight|" in result.stdout and "| completed" in result.stdout


@pytest.mark.slow
def test_each_variant_writes_its_tensorboard_scalars(compared: tuple[Path, object]) -> None:
    # So that `tensorboard --logdir COMPARE_DIR` overlays the variants' curves.
    out, _ = compared
    for variant in ("subdivisions-auto", "subdivisions-1"):
        assert list((out / variant / "tensorboard").glob("events.out.tfevents.*")), variant


@pytest.mark.slow
def test_compare_writes_a_plot_that_decodes(compared: tuple[Path, object]) -> None:
    out, _ = compared
    image = matplotlib.image.imread(out / "compare.png")
    assert image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.slow
def test_plot_command_on_two_run_directories(compared: tuple[Path, object], tmp_path: Path) -> None:
    out, _ = compared
    result = invoke(
        "plot", str(out / "subdivisions-auto"), str(out / "subdivisions-1"), "--out", str(tmp_path / "p.png")
    )
    assert result.returncode == 0, result.stderr
    assert matplotlib.image.imread(tmp_path / "p.png").shape[0] > 100


def test_plot_command_names_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    result = invoke("plot", str(tmp_path), "--out", str(tmp_path / "p.png"))
    assert result.returncode == 2
    assert f"Error: {tmp_path}: not a run folder (no run.json)" in result.stderr and "Traceback" not in result.stderr
    # A run that logged no epoch yet is a run folder without metrics: a data error that names the file.
    (tmp_path / "run.json").write_text('{"status": "failed", "started": ""}')
    result = invoke("plot", str(tmp_path), "--out", str(tmp_path / "p.png"))
    assert result.returncode == 1 and "metrics.jsonl" in result.stderr
    assert not (tmp_path / "p.png").exists()


@pytest.mark.slow
def test_another_key_varies_and_a_failing_variant_is_reported_while_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A learning rate of 1e38 makes the weights overflow after the first update: that variant fails as it trains,
    # the other finishes. 22 samples: two whole batches, as above; no TensorBoard, which the test above checks.
    config = tiny_config(tmp_path, data={"samples": 22}, output={"tensorboard": False})
    vary = "optimizer.learning_rate=0.01,1e38"
    commands = variants_in_this_process(monkeypatch)
    result = invoke("compare", str(config), "--vary", vary, "--run-dir", str(tmp_path / "out"))
    assert [command[-3:] for command in commands] == [
        ["optimizer.learning_rate=0.01", "--run-dir", str(tmp_path / "out" / "optimizer.learning_rate-0.01")],
        ["optimizer.learning_rate=1e38", "--run-dir", str(tmp_path / "out" / "optimizer.learning_rate-1e38")],
    ]
    assert result.returncode == 1
    assert "1 of 2 variants failed" in result.stderr
    report = json.loads((tmp_path / "out" / "compare.json").read_text())
    ok, failed = report["variants"]
    assert (ok["key"], ok["value"], failed["value"]) == ("optimizer.learning_rate", "0.01", "1e38")
    assert "subdivisions" not in ok and ok["run_dir"].endswith("optimizer.learning_rate-0.01")
    assert ok["status"] == "completed" and len(ok["metrics"]) == 2
    assert failed["status"] == "failed (exit 1)"
    assert failed["error"].startswith("training diverged: the loss is nan at epoch 1, batch 2"), failed["error"]
    assert "learning_rate" in result.stdout.splitlines()[-5]
    assert "failed (exit 1): " in result.stdout


def test_every_variants_config_is_checked_before_the_first_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(tmp_path)
    commands = variants_in_this_process(monkeypatch)
    for vary, expected in (
        ("optimizer.name=sgd,no_such_optimizer", "optimizer.name: unknown optimizer"),
        ("optimizer.nam=adam,sgd", "optimizer.nam"),
        ("training.subdivisions=2,11", "training.subdivisions"),
    ):
        result = invoke("compare", str(config), "--vary", vary, "--run-dir", str(tmp_path / "out"))
        assert result.returncode == 1 and expected in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert commands == [] and not (tmp_path / "out").exists()


def test_vary_and_subdivisions_together_are_a_usage_error(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    both = invoke("compare", str(config), "--vary", "optimizer.name=adam,sgd", "--subdivisions", "3,1")
    assert both.returncode == 2 and "--vary and --subdivisions each choose what to compare" in both.stderr
    one_value = invoke("compare", str(config), "--vary", "optimizer.name=adam")
    assert one_value.returncode == 2 and "is not KEY=VALUE,VALUE[,...]" in one_value.stderr
