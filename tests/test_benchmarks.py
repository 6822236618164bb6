"""The benchmark harness: ``benchmarks/run.py --smoke`` run end to end on a tiny workload (its runs in this
process), a child run as the harness runs one, and the targets it reports computed from given results."""

from __future__ import annotations

import importlib.util
import json
import resource
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import invoke

REPO = Path(__file__).resolve().parent.parent
METHODS = ("accumrun", "accumrun_xla", "keras_accum", "python_loop", "fit_sub", "fit_full")


def script(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module (the scripts are outside the package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def harness() -> ModuleType:
    """``benchmarks/run.py`` as a module."""
    return script("run")


def in_this_process(command: list[str], log: Path, timeout: float, repo: Path = REPO) -> tuple[int, float, float]:
    """``run_child`` in this process: the child's command (``accumrun train`` or a peer) run here, and this
    process's peak RSS. Six children would import TensorFlow six times; ``run_child`` itself is tested below."""
    started = time.perf_counter()
    if command[1:3] == ["-m", "accumrun"]:
        result = invoke(*command[3:])
        log.write_text(result.stderr)
        code = result.returncode
    else:
        argv, sys.argv = sys.argv, command[1:]
        try:
            script("peers").main()
        finally:
            sys.argv = argv
        code = 0
    return code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, time.perf_counter() - started


@pytest.mark.slow
def test_smoke_benchmark_measures_every_method_and_reports_the_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "bench.md"
    run = harness()
    monkeypatch.setattr(run, "run_child", in_this_process)
    monkeypatch.setattr(sys, "argv", ["benchmarks/run.py", "--smoke", "--out", str(out)])
    run.main()

    markdown = out.read_text()
    for method in METHODS:
        assert f"| {method} |" in markdown, method
    assert "## Targets" in markdown and "| target | measured | result |" in markdown
    # dispatch's two throughput targets; the smoke run has dispatch alone.
    assert markdown.count("| met |") + markdown.count("| NOT met |") == 2
    assert "not measured" not in markdown

    report = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["workload"], r["method"], r["subdivisions"]): r for r in report["results"]}
    assert set(runs) == {("dispatch", method, 4) for method in METHODS}
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["samples_per_second"] > 0, run
        assert run["peak_rss_mib"] > 0, run
        assert len(run["epoch_samples_per_second"]) == report["epochs"] == 2, run


@pytest.mark.subprocess
def test_a_child_runs_to_its_end_with_its_exit_code_peak_memory_and_time(tmp_path: Path) -> None:
    run = harness()
    code, peak_rss_mib, seconds = run.run_child([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "log", 60)
    assert code == 3 and peak_rss_mib > 0 and seconds > 0


def test_the_memory_targets_compare_each_s_with_fit_at_the_sub_batch_and_ask_that_rss_falls() -> None:
    run = harness()

    def measured(method: str, s: int, rss: float, status: str = "ok") -> object:
        return run.Result("memory", method, 128, s, status=status, samples_per_second=100.0, peak_rss_mib=rss)

    results = [measured("accumrun", 1, 700), measured("fit_sub", 1, 690), measured("accumrun", 2, 650)]
    results += [measured("fit_sub", 2, 560), measured("accumrun", 4, 600), measured("fit_sub", 4, 0, "failed")]
    targets = {t.target: (t.measured, t.met) for t in run.evaluate_targets(results)}
    assert targets == {
        "memory S=1: accumrun peak RSS at batch 128 <= 1.1x fit_sub at batch 128": ("1.01x", True),
        "memory S=2: accumrun peak RSS at batch 128 <= 1.1x fit_sub at batch 64": ("1.16x", False),
        "memory S=4: accumrun peak RSS at batch 128 <= 1.1x fit_sub at batch 32": ("not measured: a run failed", False),
        # A failed run leaves a gap in the series: falling cannot be claimed.
        "memory: accumrun peak RSS falls at every step as S grows": ("S=1: 700, S=2: 650 MiB", False),
    }
    falling = [measured(method, s, 700 - 50 * s) for s in (1, 2) for method in ("accumrun", "fit_sub")]
    last = run.evaluate_targets(falling)[-1]
    assert (last.measured, last.met) == ("S=1: 650, S=2: 600 MiB", True)


def test_the_lora_memory_table_in_the_docs_is_the_scripts_rendering_of_its_json() -> None:
    """``docs/benchmarks-lora.md``'s latest table is what ``benchmarks/lora_memory.py`` prints for the figures it
    wrote (``docs/benchmarks-lora-5.json``): the training's peak among them, with each verdict against its target;
    and from a GPU's figures, the verdicts on the device's peak."""
    report = json.loads((REPO / "docs" / "benchmarks-lora-5.json").read_text())
    table = script("lora_memory").markdown(report)
    assert table in (REPO / "docs" / "benchmarks-lora.md").read_text()
    assert "| lora | " in table and "<= 0.5x: not met | 1,570 MiB |" in table
    # From a GPU, the ratios and the activations are read on the device's peak.
    for name, peak in (("full", 1000), ("lora", 400), ("lora_int8", 450)):
        report["variants"][name]["device_peak_bytes"] = peak * 2**20
        report["variants"][name]["peak_device_mib_logged"] = peak - 2
    rows = script("lora_memory").markdown(report).splitlines()
    assert "| vs full (device) |" in rows[0] and rows[0].endswith("| device peak |") and rows[3].endswith("| 400 MiB |")
    assert "| 191 MiB | 1,571 MiB | 0.40x | <= 0.5x: met | 398 MiB |" in rows[3]
    assert "| 0.45x | <= 0.4x: not met |" in rows[4]
