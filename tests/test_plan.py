"""``training.memory_budget`` and ``accumrun plan``: the fixed bytes by arithmetic, the line the probes give, the
budget's refusals, and what ``subdivisions: auto`` chooses under a budget and records."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml

from accumrun import train
from accumrun.config.loading import load_config, load_resume_config
from accumrun.config.memory_budget import size_bytes
from accumrun.core.footprint import footprint
from accumrun.errors import ConfigError
from accumrun.kinds import Feed
from accumrun.training import autosub, probe
from accumrun.training.budget import choose_under_budget
from accumrun.training.peak import PeakMeter
from accumrun.training.plan import make_plan, variants
from accumrun.training.plan_table import plan_lines
from accumrun.training.probe import Measured
from tests.helpers import invoke, tiny_config

MiB = 2**20


@pytest.mark.parametrize(("text", "size"), [("6GiB", 6 * 2**30), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000)])
def test_sizes_read_binary_and_decimal_units(text: str, size: int) -> None:
    assert size_bytes(text) == size


def test_a_size_without_a_unit_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^training\.memory_budget: must be a size such as 6GiB"):
        load_config({"training": {"memory_budget": "512"}})


def test_fixed_bytes_count_frozen_weights_but_not_their_gradients_or_slots() -> None:
    inputs = keras.Input((4,))
    frozen = keras.layers.Dense(8, trainable=False)
    model = keras.Model(inputs, keras.layers.Dense(3)(frozen(inputs)))
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    fixed = footprint(model, optimizer, (4,), 10, sample_bytes=1, feed=Feed.SUB_BATCH)
    # By hand: the frozen layer's 4*8+8 weights and the trained layer's 8*3+3, float32; Adam's two slots and the
    # two float32 accumulators (the gradient sum, one sub-batch's gradients) of the trained ones; Adam's int64
    # iteration count and float32 learning rate; a streamed sub-batch of 5 uint8 samples of 4 values.
    assert fixed.parameters == (40 + 27) * 4
    assert fixed.optimizer_state == 2 * 27 * 4 + 8 + 4
    assert fixed.accumulators == 2 * 27 * 4
    assert fixed.fixed(5) == (40 + 27) * 4 + (2 * 27 * 4 + 12) + 2 * 27 * 4 + 5 * 4


def test_the_meter_sees_a_new_allocation() -> None:
    meter = PeakMeter()
    held = np.ones(64 * MiB // 8)  # 64 MiB of float64, every page written
    assert meter.peak() >= held.nbytes
    assert meter.device is None  # the suite runs on the CPU


def _linear(runtime: float, per_sample: float, out_of_memory_above: int = 1 << 30, seconds: float = 1e-3):
    """A fake probe: the peak is the fixed bytes, ``runtime`` and ``per_sample`` bytes per sample of the sub-batch."""

    def measure(config, subdivisions: int) -> Measured:
        sub_batch = -(-config.training.batch_size // subdivisions)
        if sub_batch > out_of_memory_above:
            return Measured(subdivisions, None, None)
        peak = int(fixed.fixed(sub_batch) + runtime + per_sample * sub_batch)
        return Measured(subdivisions, peak, seconds * (1 + subdivisions / 10))

    from accumrun.core.footprint import Footprint

    fixed = Footprint(1000, 2000, 3000, 16, 64, Feed.BATCH)
    return fixed, measure


def test_the_probes_line_predicts_every_candidate_and_the_budget_picks_the_fastest_that_fits(tmp_path: Path) -> None:
    config = load_config(tiny_config(tmp_path, training={"batch_size": 64, "subdivisions": 1}))
    fixed, measure = _linear(runtime=5 * MiB, per_sample=MiB, out_of_memory_above=40)
    budget = int(fixed.fixed(16) + 5 * MiB + 16 * MiB)  # sub-batches of 16 fit exactly, of 32 do not
    plan = make_plan(config, fixed, budget, (), measure, lambda line: None)
    (fitted,) = plan.fitted
    # Sub-batches of 64 ran out of memory; 32 was the largest probed, then 8 (the nearest to the geometric mean of 32
    # and 1) and 1.
    assert [(p.subdivisions, p.out_of_memory) for p in fitted.probes] == [
        (1, True),
        (2, False),
        (8, False),
        (64, False),
    ]
    # The peaks are exactly linear, so the line is the fake's, to the rounding of the peaks to whole bytes.
    assert fitted.activations_per_sample == pytest.approx(MiB, abs=1 / 28)
    assert fitted.runtime == pytest.approx(5 * MiB, abs=1)
    rows = {row.subdivisions: row for row in plan.rows}
    for subdivisions, row in rows.items():
        sub_batch = -(-64 // subdivisions)
        assert row.peak == pytest.approx(fixed.fixed(sub_batch) + 5 * MiB + MiB * sub_batch, abs=64)
    assert [s for s, row in rows.items() if row.fits] == [4, 8, 16, 32, 64]
    assert rows[1].fits is False and rows[1].seconds_per_sample is None
    assert plan.recommended == ("training.subdivisions=4",)


def test_activations_that_the_peaks_do_not_show_are_said_so_not_given_a_negative_size(tmp_path: Path) -> None:
    # A small model: the peaks fall by 100 bytes a sample, within the allocator's noise.
    config = load_config(tiny_config(tmp_path, training={"batch_size": 64, "subdivisions": 1}))
    fixed, measure = _linear(runtime=5 * MiB, per_sample=-100)
    lines = plan_lines(make_plan(config, fixed, None, (), measure, lambda line: None))
    assert lines[2].startswith("  as configured: activations too small to see in the peaks, runtime 5.000 MiB;")


def test_auto_under_a_budget_stops_at_the_first_fit_and_refuses_when_none_does(tmp_path: Path) -> None:
    config = load_config(tiny_config(tmp_path, training={"batch_size": 64, "subdivisions": "auto"}))
    fixed, measure = _linear(runtime=5 * MiB, per_sample=MiB)
    budget = int(fixed.fixed(16) + 5 * MiB + 16 * MiB)
    note = choose_under_budget(config, budget, 64, measure, lambda line: None)
    assert (note.chosen, note.tried, note.memory_budget) == (4, (1, 2, 4), budget)
    assert [probe.peak is not None and probe.peak <= budget for probe in note.candidates] == [False, False, True]
    with pytest.raises(ConfigError, match=r"^training\.memory_budget: 1.000 MiB: no candidate fits.*least peak"):
        choose_under_budget(config.with_subdivisions("auto"), MiB, 64, measure, lambda line: None)


def test_a_budget_below_the_fixed_bytes_is_one_line_with_both_figures(tmp_path: Path) -> None:
    path = tiny_config(tmp_path)
    for command in (
        ["train", str(path), "--set", "training.memory_budget=1KiB"],
        ["plan", str(path), "--memory-budget", "1KiB"],
    ):
        result = invoke(*command)
        assert result.returncode == 1
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: training.memory_budget: 1KiB (0.001 MiB) is smaller than the run's fixed bytes,")


@pytest.mark.slow
def test_auto_under_a_budget_records_every_probe_in_run_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    peaks = {1: 90 * MiB, 2: 70 * MiB, 4: 50 * MiB}
    monkeypatch.setattr(autosub, "measure_in_fresh_process", lambda config, s: Measured(s, peaks[s], 1e-3 * s))
    path = tiny_config(tmp_path, training={"subdivisions": "auto", "memory_budget": "64MiB", "epochs": 1})
    train(load_config(path), tmp_path / "run")
    note = json.loads((tmp_path / "run" / "run.json").read_text())["subdivisions_auto"]
    assert note == {
        "chosen": 4,
        "tried": [1, 2, 4],
        "memory_budget": 64 * MiB,
        "remat": "none",
        "candidates": [
            {"subdivisions": s, "peak": peaks[s], "seconds_per_sample": pytest.approx(1e-3 * s), "remat": "none"}
            for s in (1, 2, 4)
        ],
    }
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["training"]["subdivisions"] == 4
    out = capsys.readouterr().out
    assert "memory_budget: subdivisions 1, remat none: peak 90.000 MiB, 1.000 ms per sample, over" in out
    assert "subdivisions: auto chose 4, remat none, under memory_budget 64MiB (tried 1, 2, 4)" in out


def test_plan_prints_a_row_per_candidate_and_writes_the_same_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Probes whose peak grows 1 MiB a sample above 30 MiB: sub-batches of up to 4 fit in 2 MiB over the arithmetic.
    def measure(config, subdivisions: int) -> Measured:
        return Measured(subdivisions, 30 * MiB + MiB * -(-10 // subdivisions), 1e-3 * subdivisions)

    monkeypatch.setattr(probe, "measure_in_fresh_process", measure)
    monkeypatch.chdir(tmp_path)
    result = invoke("plan", str(tiny_config(tmp_path)), "--memory-budget", "34.5MiB", "--json", "plan.json")
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "plan.json").read_text())
    (variant,) = document["variants"]
    # Three probes: the fewest subdivisions (sub-batches of 10), the most (of 1) and between (of 3, near sqrt(10)).
    assert [p["subdivisions"] for p in variant["probes"]] == [1, 4, 10]
    # The whole batch's input (data.feed: batch) is fixed, so all the growth is activations; the peaks are whole bytes.
    assert variant["activations_per_sample"] == pytest.approx(MiB, abs=1)
    assert [(row["subdivisions"], row["fits"]) for row in document["rows"]] == [
        (1, False),
        (2, False),
        (3, True),
        (4, True),
        (8, True),
        (10, True),
    ]
    assert document["recommended"] == ["training.subdivisions=3"]
    table = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [(int(row[0]), row[7]) for row in table] == [
        (1, "no"),
        (2, "no"),
        (3, "yes"),
        (4, "yes"),
        (8, "yes"),
        (10, "yes"),
    ]
    assert result.stdout.splitlines()[-1] == "recommended: --set training.subdivisions=3"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_probe_in_a_fresh_process_measures_peak_and_time(tmp_path: Path) -> None:
    measured = probe.measure_in_fresh_process(load_config(tiny_config(tmp_path)), 2)
    assert measured.subdivisions == 2
    # At least the process's TensorFlow runtime, above the imports: a traced step and its kernels.
    assert measured.peak is not None and measured.peak > MiB
    assert measured.seconds_per_sample is not None and 0 < measured.seconds_per_sample < 1


def test_variants_are_every_combination_of_the_axes_and_a_refused_value_is_a_config_error(tmp_path: Path) -> None:
    config = load_config(tiny_config(tmp_path))
    made = variants(config, [("training.precision", ["float32", "mixed_bfloat16"]), ("training.epochs", ["1", "3"])])
    assert [(v.precision, v.config.training.epochs) for v in made] == [
        ("float32", 1),
        ("float32", 3),
        ("mixed_bfloat16", 1),
        ("mixed_bfloat16", 3),
    ]
    assert [v.overrides for v in variants(config, [("training.precision", [])])] == [()]
    (adapted,) = variants(config, [("model.lora", ["{rank: 2}"]), ("model.quantize", ["int8"])])
    assert (adapted.lora, made[0].lora) == ("rank 2, int8", None)
    with pytest.raises(ConfigError, match=r"training\.precision"):
        variants(config, [("training.precision", ["float8"])])


def test_remat_auto_under_a_budget_chooses_the_fastest_pair_and_probes_remat_only_below_the_fewest_that_fit(
    tmp_path: Path,
) -> None:
    # Bytes per sample and time per sample by mode: recomputing keeps less and costs more at the same subdivisions.
    per_sample = {"none": 10 * MiB, "activations": 7 * MiB, "layers": 4 * MiB}
    slower = {"none": 1.0, "activations": 1.1, "layers": 1.2}

    def measure(config, subdivisions: int) -> Measured:
        mode = config.training.remat.value
        sub_batch = -(-64 // subdivisions)
        return Measured(subdivisions, per_sample[mode] * sub_batch, 1e-3 * slower[mode] * (1 + subdivisions / 10))

    training = {"batch_size": 64, "subdivisions": "auto", "remat": "auto"}
    config = load_config(tiny_config(tmp_path, data={"samples": 80}, training=training))
    note = choose_under_budget(config, 25 * MiB, 64, measure, lambda line: None)
    # An MLP has no blocks. none fits from 32 subdivisions (sub-batches of 2); activations, probed below 32 only,
    # fits nowhere; layers fits at 16 (sub-batches of 4) and is faster there than none at 32.
    assert [(c.remat, c.subdivisions) for c in note.candidates] == [
        *(("none", s) for s in (1, 2, 4, 8, 16, 32)),
        *(("activations", s) for s in (1, 2, 4, 8, 16)),
        *(("layers", s) for s in (1, 2, 4, 8, 16)),
    ]
    assert (note.chosen, note.remat) == (16, "layers")


def test_plan_with_remat_auto_has_a_row_per_mode_the_model_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "measure_in_fresh_process", lambda config, s: Measured(s, 30 * MiB, 1e-3))
    monkeypatch.chdir(tmp_path)
    result = invoke("plan", str(tiny_config(tmp_path)), "--set", "training.remat=auto", "--json", "plan.json")
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "plan.json").read_text())["rows"]
    # An MLP has no blocks; each other mode gets the six candidates of a batch of 10 with subdivisions 3.
    assert [row["remat"] for row in rows] == [mode for mode in ("none", "activations", "layers") for _ in range(6)]


def test_a_resume_given_remat_and_subdivisions_auto_keeps_what_the_run_chose(tmp_path: Path) -> None:
    auto = {"subdivisions": "auto", "remat": "auto", "memory_budget": "64MiB"}
    path = tiny_config(tmp_path, training=auto)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    chosen = load_config(path, ["training.subdivisions=4", "training.remat=layers"])
    (run_dir / "config.yaml").write_text(chosen.to_yaml())
    resumed = load_resume_config(run_dir, path)
    assert (resumed.training.subdivisions, resumed.training.remat.value) == (4, "layers")
