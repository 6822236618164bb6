"""``subdivisions: auto``: out-of-memory errors, raised inside the real step above a sub-batch size, settle the
subdivisions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from accumrun import train
from accumrun.config.loading import load_config
from accumrun.errors import ConfigError
from tests import hook_models
from tests.helpers import tiny_config

# 22 samples: 20 to train on, two whole batches of 10, so each run traces the step for one batch size alone (no
# short last batch, which the search has nothing to do with).
HOOKED = {"model": {"name": "tests.hook_models:mlp", "hidden": [8]}, "data": {"samples": 22}}


@pytest.fixture(autouse=True)
def hooks() -> Iterator[None]:
    hook_models.reset()
    yield
    hook_models.reset()


@pytest.mark.slow
def test_auto_settles_on_the_fewest_subdivisions_that_fit_from_where_max_sub_batch_starts(tmp_path: Path) -> None:
    # Batches of 10: sub-batches of at most 5 start the search at 2 subdivisions; 2 -> 5 samples per sub-batch run
    # out of memory, 4 -> at most 3 fit. The search from 1 (no max_sub_batch) is asserted by the broken runtime's
    # test below (tried 1, 2).
    path = tiny_config(tmp_path, training={"max_sub_batch": 5}, **HOOKED)
    fixed = train(load_config(path, ["training.subdivisions=4"]), tmp_path / "fixed", quiet=True)
    hook_models.reset(largest_sub_batch=3)
    auto = train(load_config(path, ["training.subdivisions=auto"]), tmp_path / "auto", quiet=True)

    for mine, theirs in zip(auto.model.variables, fixed.model.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    status = json.loads((tmp_path / "auto" / "run.json").read_text())
    assert status["subdivisions_auto"] == {"chosen": 4, "tried": [2, 4]}
    assert yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["training"]["subdivisions"] == 4
    assert [row["subdivisions"] for row in auto.metrics] == [4, 4]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_broken_runtime_falls_back_to_a_probe_in_a_fresh_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fresh process has no injected failure, so it finds that 2 subdivisions (sub-batches of 5) fit.
    hook_models.reset(largest_sub_batch=5, broken_once_for=5)
    path = tiny_config(tmp_path, training={"subdivisions": "auto", "epochs": 1}, **HOOKED)
    result = train(load_config(path), tmp_path / "run")
    assert result.metrics[0]["subdivisions"] == 2
    output = capsys.readouterr().out
    assert "subdivisions 2: UnknownError after out of memory" in output
    assert "probing subdivisions 2 in a fresh process" in output
    assert "subdivisions: auto chose 2 (tried 1, 2)" in output


@pytest.mark.slow
def test_auto_gives_up_clearly_when_nothing_fits(tmp_path: Path) -> None:
    hook_models.reset(largest_sub_batch=0)
    # Batches of 2: the search tries 1 and 2 subdivisions before it runs out of sub-batches to cut.
    path = tiny_config(tmp_path, training={"batch_size": 2}, **HOOKED)
    with pytest.raises(ConfigError, match="auto: out of memory even with sub-batches of one sample"):
        train(load_config(path, ["training.subdivisions=auto"]), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
