"""``check --memory``: the estimate counts the variables exactly and the activations per sub-batch sample."""

from __future__ import annotations

from pathlib import Path

import keras

from accumrun.kinds import Feed
from accumrun.reports.memory import candidate_subdivisions, estimate_memory, forward_activation_bytes
from tests.helpers import invoke, tiny_config


def small_mlp() -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def test_fixed_costs_count_every_variable() -> None:
    model = small_mlp()
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    estimate = estimate_memory(model, optimizer, (4,), batch_size=10, traced_sub_batch=5)
    parameters = (4 * 8 + 8) + (8 * 3 + 3)
    assert estimate.parameters == parameters * 4
    # Adam: two moments per parameter, plus its iteration counter (int64) and learning rate (float32).
    assert estimate.optimizer_state == 2 * parameters * 4 + 8 + 4
    assert estimate.accumulators == 2 * parameters * 4
    assert estimate.input_bytes(5) == 10 * 4 * 4  # the whole batch of float32 samples


def test_the_input_counts_its_stored_bytes_and_only_a_sub_batch_when_streamed() -> None:
    model = small_mlp()
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    whole = estimate_memory(model, optimizer, (4,), batch_size=10, traced_sub_batch=5, sample_bytes=1)
    streamed = estimate_memory(model, optimizer, (4,), 10, 5, sample_bytes=1, feed=Feed.SUB_BATCH)
    assert whole.input_bytes(5) == 10 * 4 and streamed.input_bytes(5) == 5 * 4
    assert whole.total(5) - streamed.total(5) == 5 * 4


def test_activations_grow_with_the_sub_batch() -> None:
    model = small_mlp()
    per_sample = forward_activation_bytes(model, (4,), 1)
    # At least the hidden layer (8 floats before and after the ReLU) and the logits (3 floats).
    assert per_sample >= (8 + 3) * 4
    assert forward_activation_bytes(model, (4,), 16) == 16 * per_sample


def test_candidates_are_powers_of_two_the_batch_and_the_configured_value() -> None:
    assert candidate_subdivisions(10, 3) == [1, 2, 3, 4, 8, 10]
    assert candidate_subdivisions(10, None) == [1, 2, 4, 8, 10]


def test_check_memory_prints_a_row_per_candidate(tmp_path: Path) -> None:
    result = invoke("check", str(tiny_config(tmp_path)), "--memory")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().endswith(("MiB", "configured"))]
    table = {int(row[0]): row for row in rows if row[0].isdigit()}
    assert sorted(table) == [1, 2, 3, 4, 8, 10]
    assert table[3][-1] == "configured" and table[3][1] == "4"
    totals = [float(table[s][4]) for s in sorted(table)]
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[-1]
