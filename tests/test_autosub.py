"""``subdivisions: auto``: out-of-memory errors, injected above a sub-batch size, settle the subdivisions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import yaml

import accumrun.run
from accumrun.config import load_config
from accumrun.errors import ConfigError
from accumrun.run import train
from accumrun.split import sub_batch_sizes
from tests.conftest import tiny_config


def inject_out_of_memory(
    monkeypatch: pytest.MonkeyPatch, largest_sub_batch: int, internal_error_at: int | None = None
) -> None:
    """Make the run's steps raise ResourceExhaustedError on sub-batches above ``largest_sub_batch`` samples,
    and an InternalError once for ``internal_error_at`` subdivisions (a runtime left broken by an OOM)."""
    make_train_step = accumrun.run.make_train_step
    broken = [internal_error_at]

    def make_guarded_step(*args: Any, **kwargs: Any) -> Callable:
        step = make_train_step(*args, **kwargs)
        subdivisions = args[3]

        def guarded_step(x: tf.Tensor, y: tf.Tensor) -> Any:
            if max(sub_batch_sizes(int(x.shape[0]), subdivisions)) > largest_sub_batch:
                raise tf.errors.ResourceExhaustedError(None, None, "injected: the sub-batch does not fit")
            if broken[0] == subdivisions:
                broken[0] = None
                raise tf.errors.InternalError(None, None, "injected: the runtime is broken")
            return step(x, y)

        return guarded_step

    monkeypatch.setattr(accumrun.run, "make_train_step", make_guarded_step)


def test_auto_settles_on_the_fewest_subdivisions_that_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Batches of 10: 1 -> 10 and 2 -> 5 samples per sub-batch run out of memory; 4 -> at most 3 fit.
    fixed = train(load_config(tiny_config(tmp_path), ["training.subdivisions=4"]), tmp_path / "fixed", quiet=True)
    inject_out_of_memory(monkeypatch, largest_sub_batch=3)
    auto = train(load_config(tiny_config(tmp_path), ["training.subdivisions=auto"]), tmp_path / "auto", quiet=True)

    for mine, theirs in zip(auto.model.variables, fixed.model.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    status = json.loads((tmp_path / "auto" / "run.json").read_text())
    assert status["subdivisions_auto"] == {"chosen": 4, "tried": [1, 2, 4]}
    assert yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["training"]["subdivisions"] == 4
    assert [row["subdivisions"] for row in auto.metrics] == [4, 4]


def test_max_sub_batch_sets_where_the_search_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inject_out_of_memory(monkeypatch, largest_sub_batch=3)
    path = tiny_config(tmp_path, training={"subdivisions": "auto", "max_sub_batch": 5, "epochs": 1})
    train(load_config(path), tmp_path / "run", quiet=True)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["subdivisions_auto"]["tried"] == [2, 4]


def test_a_broken_runtime_falls_back_to_a_probe_in_a_fresh_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fresh process has no injected limit, so it finds that 2 subdivisions fit.
    inject_out_of_memory(monkeypatch, largest_sub_batch=5, internal_error_at=2)
    path = tiny_config(tmp_path, training={"subdivisions": "auto", "epochs": 1})
    result = train(load_config(path), tmp_path / "run")
    assert result.metrics[0]["subdivisions"] == 2
    output = capsys.readouterr().out
    assert "subdivisions 2: InternalError after out of memory" in output
    assert "probing subdivisions 2 in a fresh process" in output
    assert "subdivisions: auto chose 2 (tried 1, 2)" in output


def test_auto_gives_up_clearly_when_nothing_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inject_out_of_memory(monkeypatch, largest_sub_batch=0)
    with pytest.raises(ConfigError, match="auto: out of memory even with sub-batches of one sample"):
        train(load_config(tiny_config(tmp_path), ["training.subdivisions=auto"]), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
