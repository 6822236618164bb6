"""`accumrun compare` stopped by a signal, and resumed: its report says where each variant stands, `plot` draws the
folder, and `compare --resume` ends as an uninterrupted comparison does. The variants run in this process (see
tests/test_compare.py), the signal sent as `signal_after_batch` sends it; one real Ctrl-C reaches a real one."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from accumrun.reports.compare import Variant, compared_curves, format_table, unplotted_variants
from accumrun.rundir.metrics import EpochRow
from accumrun.stops import resume_command
from tests.helpers import invoke, signal_after_batch, start_paused, tiny_config
from tests.test_compare import variants_in_this_process
from tests.test_resume import training_rows

VALUES = ["subdivisions-2", "subdivisions-5", "subdivisions-1"]


def _statuses(folder: Path) -> list[str]:
    return [variant["status"] for variant in json.loads((folder / "compare.json").read_text())["variants"]]


def _epoch_table(stdout: str) -> list[str]:
    """The per-epoch lines of compare's table (the losses, their spread), without the timings below them."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("epoch |"))
    return lines[start : lines.index("", start)]


@pytest.mark.slow
def test_a_stopped_comparison_resumes_to_the_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 22 samples: 20 to train on, two batches per epoch, 4 per variant over 2 epochs.
    config = tiny_config(tmp_path, data={"samples": 22}, output={"tensorboard": False})
    compare = ["compare", str(config), "--subdivisions", "2,5,1", "--run-dir"]
    variants_in_this_process(monkeypatch)
    reference = invoke(*compare, str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr

    # Batch 7 of the process is the second variant's epoch 2, batch 1.
    out = tmp_path / "out"
    signal_after_batch(monkeypatch, 4 + 3, [signal.SIGINT])
    stopped = invoke(*compare, str(out))
    monkeypatch.undo()
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr and "Aborted" not in stopped.stderr
    assert stopped.stderr.rstrip().endswith(f"resume with: {resume_command(out, 'compare')}")
    assert "accumrun compare --resume" in stopped.stderr
    assert _statuses(out) == ["completed", "stopped", "not started"]
    assert "  subdivisions 5: stopped (SIGINT at epoch 2, batch 1; saved " in stopped.stderr
    assert json.loads((out / "subdivisions-5" / "run.json").read_text())["status"] == "interrupted"
    assert not (out / "subdivisions-1").exists()

    # plot draws the folder as it is, naming the unfinished variants.
    assert set(compared_curves(out)) == {"subdivisions 2", "subdivisions 5: stopped"}
    assert unplotted_variants(out) == ["off (subdivisions 1): not started"]
    plotted = invoke("plot", str(out), "--out", str(tmp_path / "p.png"))
    assert plotted.returncode == 0, plotted.stderr

    commands = variants_in_this_process(monkeypatch)
    resumed = invoke("compare", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert [command[4:6] for command in commands] == [
        ["--resume", str(out / "subdivisions-5")],
        [str(config), "--quiet"],
    ]
    assert "== resuming subdivisions 5 -> " in resumed.stdout
    assert _statuses(out) == ["completed"] * 3
    assert _epoch_table(resumed.stdout) == _epoch_table(reference.stdout)
    ours, theirs = (json.loads((folder / "compare.json").read_text()) for folder in (out, tmp_path / "reference"))
    assert [v["max_weight_difference"] for v in ours["variants"]] == [
        v["max_weight_difference"] for v in theirs["variants"]
    ]
    # The resumed process traced its step again at epoch 2: the speed figures leave that epoch out too.
    assert [v["started_epochs"] for v in ours["variants"]] == [[1], [1, 2], [1]]
    for name in VALUES:
        assert training_rows(out / name) == training_rows(tmp_path / "reference" / name)
        mine = keras.models.load_model(out / name / "model.keras", compile=False).get_weights()
        reference_weights = keras.models.load_model(tmp_path / "reference" / name / "model.keras", compile=False)
        for a, b in zip(mine, reference_weights.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)

    again = invoke("compare", "--resume", str(out))
    assert again.returncode == 1 and "every variant of this comparison has run" in again.stderr


def test_the_speed_figures_leave_out_each_processs_first_epoch(tmp_path: Path) -> None:
    # Epochs 1 and 3 each started a process (the second resumed the run), so each traced the step: the median
    # seconds and samples/s are those of epochs 2 and 4 alone.
    rows = [
        EpochRow(epoch=epoch, loss=0.5, seconds=seconds, samples_per_second=speed, peak_rss_mib=100.0)
        for epoch, seconds, speed in ((1, 5.0, 10.0), (2, 1.0, 50.0), (3, 4.0, 12.0), (4, 1.2, 40.0))
    ]
    variant = Variant(4, tmp_path, exit_code=0, metrics=rows, started_epochs=[1, 3])
    assert variant.timed_rows == [rows[1], rows[3]]
    summary = format_table([variant]).splitlines()[-1].split("|")
    assert [cell.strip() for cell in summary[:3]] == ["4", "1.10", "45"]
    assert variant.label == "subdivisions 4: 1.10 s/epoch, peak 100 MiB RSS"
    assert Variant.from_json(variant.to_json(), tmp_path).started_epochs == [1, 3]


def test_resume_takes_a_comparison_folder_alone(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    result = invoke("compare", "--resume", str(tmp_path))
    assert result.returncode == 2 and f"{tmp_path}: not a comparison's folder (no compare.json)" in result.stderr
    (tmp_path / "compare.json").write_text("{}")
    result = invoke("compare", str(config), "--resume", str(tmp_path))
    assert result.returncode == 2 and "--resume goes on with the comparison as it was started" in result.stderr
    result = invoke("compare")
    assert result.returncode == 2 and "missing CONFIG (or --resume DIR" in result.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_ctrl_c_at_a_terminal_stops_a_real_comparison_with_a_checkpoint(tmp_path: Path) -> None:
    # Ctrl-C at a terminal signals its whole foreground process group: the comparison and its variant's process,
    # in a session of their own here. Each forward pass of the variant pauses 0.1 s, so it is still training. The
    # folder it leaves is the one the test above resumes.
    config = tiny_config(
        tmp_path,
        data={"samples": 22},
        model={"name": "tests.hook_models:mlp", "hidden": [8]},
        training={"epochs": 20},
        output={"tensorboard": False},
    )
    out = tmp_path / "out"
    command = ["-m", "accumrun", "compare", str(config), "--subdivisions", "2,1", "--run-dir", str(out)]
    process = start_paused(command, tmp_path, start_new_session=True)
    try:
        rows = out / "subdivisions-2" / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (rows.is_file() and rows.read_text().strip()) and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[0] == "SIGINT: stopping after the updates under way (Ctrl-C again to stop at once)", stderr
    assert lines[1] == f"compare stopped by SIGINT; wrote {out / 'compare.json'}:", stderr
    assert lines[2].startswith("  subdivisions 2: stopped (SIGINT at epoch "), stderr
    assert lines[3:] == ["  off (subdivisions 1): not started", f"resume with: {resume_command(out, 'compare')}"]
    assert _statuses(out) == ["stopped", "not started"]
    assert json.loads((out / "subdivisions-2" / "run.json").read_text())["status"] == "interrupted"


def test_a_variant_left_running_by_a_killed_comparison_runs_again_from_where_its_folder_stands(tmp_path: Path) -> None:
    # The comparison's own process was killed (SIGKILL, a lost machine): compare.json still says "running".
    listed = [
        {"key": "training.subdivisions", "value": value, "run_dir": f"elsewhere/subdivisions-{value}", "status": status}
        for value, status in ((4, "running"), (2, "running"), (1, "running"), (3, "failed (exit 1)"))
    ]
    (tmp_path / "compare.json").write_text(json.dumps({"config": "tiny.yaml", "variants": listed}))
    (tmp_path / "subdivisions-4" / "checkpoints").mkdir(parents=True)
    (tmp_path / "subdivisions-4" / "checkpoints" / "ckpt-epoch00001-batch0000001.npz").write_bytes(b"")
    (tmp_path / "subdivisions-2").mkdir()  # stopped before its first checkpoint
    (tmp_path / "subdivisions-1").mkdir()
    (tmp_path / "subdivisions-1" / "run.json").write_text('{"status": "completed", "started": ""}')
    resumed, fresh, completed, failed = (Variant.from_json(entry, tmp_path) for entry in listed)
    assert resumed.command(Path("tiny.yaml"), [])[3:] == [
        "train",
        "--resume",
        str(tmp_path / "subdivisions-4"),
        "--quiet",
    ]
    assert fresh.exit_code is None and fresh.command(Path("tiny.yaml"), ["training.epochs=2"])[3:] == [
        *("train", "tiny.yaml", "--quiet", "--set", "training.epochs=2", "--subdivisions", "2"),
        *("--run-dir", str(tmp_path / "subdivisions-2"), "--overwrite"),
    ]
    assert (completed.status, failed.status) == ("completed", "failed (exit 1)")
    # Its config is named as the comparison was given it: from another folder it is not found.
    result = invoke("compare", "--resume", str(tmp_path))
    assert result.returncode == 1 and "the comparison's config tiny.yaml is not found from here" in result.stderr
