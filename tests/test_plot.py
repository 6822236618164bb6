"""Loss plots from fake run directories: reading metrics.jsonl, its errors, and the PNG that comes out."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from accumrun.errors import DataError
from accumrun.reports.compare import compared_curves
from accumrun.reports.plot import plot_curves
from accumrun.rundir.metrics import load_metrics
from tests.helpers import invoke


def fake_rows(epochs: int, scale: float, validation: bool = True) -> list[dict[str, Any]]:
    """Rows shaped like run.py's: a decaying loss, and val_loss when ``validation``."""
    rows = []
    for epoch in range(1, epochs + 1):
        row: dict[str, Any] = {"epoch": epoch, "loss": scale * math.exp(-epoch / 3), "accuracy": 1 - 1 / (epoch + 1)}
        if validation:
            row.update(val_loss=1.2 * scale * math.exp(-epoch / 4), val_accuracy=1 - 1.5 / (epoch + 2))
        row.update(seconds=2.1, samples_per_second=800.0, batch_size=64, subdivisions=8, optimizer_steps=26 * epoch)
        rows.append(row)
    return rows


def write_run(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def assert_png(path: Path) -> None:
    """The PNG decodes to a real picture and no temporary file is left beside it."""
    image = imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert (image != image[0, 0]).any(axis=-1).any()  # more than one colour; np.unique(axis=0) takes 1 s
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_two_runs_load_and_plot(tmp_path: Path) -> None:
    plain = write_run(tmp_path / "runs" / "plain", fake_rows(12, 2.0))
    subdivided = write_run(tmp_path / "runs" / "sub8", fake_rows(12, 2.3))
    curves = {
        "subdivisions 1 — 3,210 MiB, 1.4 s/epoch": load_metrics(plain),
        "subdivisions 8 — 412 MiB, 2.1 s/epoch": load_metrics(subdivided),
    }
    assert curves["subdivisions 1 — 3,210 MiB, 1.4 s/epoch"] == fake_rows(12, 2.0)

    out = tmp_path / "plots" / "nested" / "loss.png"
    assert plot_curves(curves, out, title="digits: subdivisions on and off") == out
    assert_png(out)


def test_curves_without_val_loss_still_plot(tmp_path: Path) -> None:
    out = plot_curves({"no validation": fake_rows(40, 1.0, validation=False)}, tmp_path / "train_only.png")
    assert_png(out)


def test_mixed_curves_and_non_positive_losses_plot(tmp_path: Path) -> None:
    # One curve without val_loss beside one with it; a zero loss forces the linear scale.
    zero = fake_rows(5, 1.0)
    zero[-1]["loss"] = 0.0
    out = plot_curves({"with val": zero, "without val": fake_rows(5, 1.0, validation=False)}, tmp_path / "m.png")
    assert_png(out)


def test_a_measured_sharpness_gets_a_panel_of_its_own_with_its_limit(tmp_path: Path) -> None:
    rows = fake_rows(10, 1.0)
    for row in rows[1::2]:
        row.update(sharpness=8.0 * (1 - math.exp(-row["epoch"] / 4)), sharpness_limit=8.0)
    with_sharpness = imread(plot_curves({"eta 0.25": rows}, tmp_path / "sharpness.png"))
    without = imread(plot_curves({"eta 0.25": fake_rows(10, 1.0)}, tmp_path / "loss.png"))
    # Three panels side by side (15 inches) against two (11 inches), at 120 dpi.
    assert (with_sharpness.shape[1], without.shape[1]) == (1800, 1320)


def test_plot_replaces_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "loss.png"
    out.write_bytes(b"old")
    plot_curves({"run": fake_rows(3, 1.0)}, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("name", "starts"), [("loss.pdf", b"%PDF"), ("loss.svg", b"<?xml"), ("loss.PNG", b"\x89PNG")])
def test_the_file_suffix_chooses_the_format(tmp_path: Path, name: str, starts: bytes) -> None:
    assert plot_curves({"run": fake_rows(3, 1.0)}, tmp_path / name).read_bytes().startswith(starts)


def test_missing_run_dir_or_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no metrics.jsonl; is this a run directory") as missing_dir:
        load_metrics(tmp_path / "nope")
    assert str(tmp_path / "nope" / "metrics.jsonl") in missing_dir.value.message
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="no metrics.jsonl"):
        load_metrics(tmp_path / "empty_dir")


def test_malformed_line_names_its_number(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", fake_rows(2, 1.0))
    with (run_dir / "metrics.jsonl").open("a") as file:
        file.write('{"epoch": 3, "loss": 0.\n')  # a run killed mid-write
    with pytest.raises(DataError, match="line 3 is not JSON"):
        load_metrics(run_dir)


def test_empty_file_has_no_rows(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [])
    with pytest.raises(DataError, match="metrics.jsonl: has no rows"):
        load_metrics(run_dir)


def test_no_curves_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no curves to plot"):
        plot_curves({}, tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


def labelled_ticks(low: float, high: float) -> list[float]:
    """The values labelled on the log axis of a panel whose curve falls from ``high`` to ``low``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from accumrun.reports.plot import _draw_panel

    rows = [{"epoch": epoch, "val_loss": high - (high - low) * epoch / 4} for epoch in range(5)]
    figure = Figure()
    ax = figure.subplots()
    _draw_panel(ax, {"run": rows}, "val_loss", "validation loss", markers=True)
    FigureCanvasAgg(figure).draw()
    assert ax.get_yscale() == "log"
    bottom, top = ax.get_ylim()
    return [
        float(label.get_text())
        for label in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()
        if label.get_text() and bottom <= label.get_position()[1] <= top
    ]


@pytest.mark.parametrize(("low", "high"), [(0.9, 1.6), (1.2, 4.0), (0.6, 3.0)])
def test_a_log_axis_within_a_decade_has_labels_above_its_base(low: float, high: float) -> None:
    shown = labelled_ticks(low, high)
    assert len([value for value in shown if value > 1.0]) >= 2, shown


@pytest.mark.parametrize(("low", "high"), [(0.02, 20.0), (0.04, 100.0), (0.07, 1.2), (0.07, 0.6), (0.028, 0.177)])
def test_a_log_axis_labels_a_tick_at_or_below_the_lowest_value(low: float, high: float) -> None:
    shown = labelled_ticks(low, high)
    assert min(shown) <= low and len(shown) >= 2, shown


def test_the_sharpness_panel_names_its_dashed_limit_or_says_there_is_none() -> None:
    from accumrun.reports.plot import _panels

    adam = [dict(row, sharpness=3.0) for row in fake_rows(4, 1.0)]
    sgd = [dict(row, sharpness=3.0, sharpness_limit=4.0) for row in fake_rows(4, 1.0)]
    assert ("sharpness", "sharpness (no limit)") in _panels({"adam": adam})
    assert ("sharpness", "sharpness (dashed: its stability limit)") in _panels({"adam": adam, "sgd": sgd})


def test_plot_on_a_comparison_folder_draws_its_variants(tmp_path: Path) -> None:
    # Laid out as `accumrun compare` leaves it; compare.json's paths relative to where compare ran.
    folder = tmp_path / "cmp"
    for value, scale in (("auto", 2.0), (1, 2.2)):
        write_run(folder / f"subdivisions-{value}", fake_rows(5, scale))
    listed = [{"key": "training.subdivisions", "value": v, "run_dir": f"away/subdivisions-{v}"} for v in ("auto", 1, 4)]
    (folder / "compare.json").write_text(json.dumps({"variants": listed}))

    curves = compared_curves(folder)  # the third variant failed before its first epoch: it has no rows
    assert curves == {"subdivisions auto": fake_rows(5, 2.0), "off (subdivisions 1)": fake_rows(5, 2.2)}
    result = invoke("plot", str(folder), "--out", str(tmp_path / "p.png"))
    assert result.returncode == 0, result.stderr
    assert_png(tmp_path / "p.png")
    (folder / "compare.json").write_text("{}")
    result = invoke("plot", str(folder), "--out", str(tmp_path / "q.png"))
    assert result.returncode == 1 and "compare.json: cannot be read as a comparison" in result.stderr
