"""Headroom-Drift Replay on the one loop (configs/headroom_drift.py, runlocal): groups enter the
buffer after the update, are replayed from the next step on with their stored advantages, and a
stopped-and-resumed run repeats the uninterrupted one (the buffer is in the checkpoint)."""

from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _config(arg="runlocal", **overrides):
  config = load_module(ROOT / "configs" / "headroom_drift.py").get_config(arg)
  config.update(dict(eval_every=100, **overrides))
  return config


def test_replay_fills_replays_and_resumes_exactly(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config(init_from=init), tmp_path / "straight")
  records = [r for r in read_metrics(tmp_path / "straight") if "train/loss" in r]
  assert records[0]["replay/accepted"] == 0  # nothing stored before the first update
  admitted = np.cumsum([r["replay/admitted"] for r in records])
  buffer = straight.parts["replay"].buffer
  assert int(buffer.count) == min(admitted[-1], 4)
  # From step 2 on, whatever was admitted before is a candidate (τ = 1 in runlocal accepts all).
  for r, before in zip(records[1:], admitted[:-1]):
    assert r["replay/candidates"] == min(before, 3)
    assert r["replay/accepted"] == min(before, 2)
  # The update's rows: 4 fresh groups + 2 replay slots of 4 rollouts, every step.
  assert all(r["train/num_updates"] == 2 for r in records)

  train_grpo(_config(init_from=init, steps=2), tmp_path / "resumed")
  resumed = train_grpo(_config(init_from=init), tmp_path / "resumed")
  again = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  for field in buffer._fields:
    got = getattr(resumed.parts["replay"].buffer, field)
    np.testing.assert_array_equal(got, getattr(buffer, field), err_msg=field)
  for key in ("train/loss", "replay/accepted", "replay/admitted", "train/grad_norm"):
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in records], key


@pytest.mark.parametrize("overrides, match", [
  ({"replay.capacity": 0}, "config.replay.capacity must be >= 1"),
  ({"replay.name": "fifo"}, "config.replay.name='fifo'"),
  ({"replay.max_candidates": 1}, r"config.replay.max_candidates \(1\) must be >= "),
  ({"loss.beta": 0.1}, "config.loss.beta = 0"),
])
def test_replay_config_errors_name_the_key(overrides, match):
  from jaxrl_post.methods import group_replay

  config = _config()
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  with pytest.raises(ValueError, match=match):
    group_replay.build_group_replay(config)
