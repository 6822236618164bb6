"""The benchmark harness, ``benchmarks/run.py --smoke``, run end to end on tiny workloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

REPO = Path(__file__).resolve().parent.parent
METHODS = ("accumrun", "accumrun_xla", "keras_accum", "python_loop", "fit_sub", "fit_full")


def test_smoke_benchmark_measures_every_method_and_reports_the_targets(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    finished = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]

    markdown = out.read_text()
    for method in METHODS:
        assert f"| {method} |" in markdown, method
    assert "## Targets" in markdown and "| target | measured | result |" in markdown
    # dispatch's two throughput targets, RSS at S=1 and S=2, RSS falling; the smoke run has no compute or
    # applications workload.
    assert markdown.count("| met |") + markdown.count("| NOT met |") == 2 + 2 + 1
    assert "not measured" not in markdown

    report = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["workload"], r["method"], r["subdivisions"]): r for r in report["results"]}
    expected = {("dispatch", method, 4) for method in METHODS}
    expected |= {("memory", method, s) for method in ("accumrun", "fit_sub") for s in (1, 2)}
    assert set(runs) == expected
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["samples_per_second"] > 0, run
        assert run["peak_rss_mib"] > 0, run
        assert len(run["epoch_samples_per_second"]) == report["epochs"] == 2, run
