"""CoKL on the one loop (configs/cokl.py, runlocal): reference answers are sampled once per pool
prompt and cached, the loss gains the CoKL term, and a stopped-and-resumed run repeats the
uninterrupted one (the cache is in the checkpoint's method arrays)."""

from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import cokl_regularizer
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _config(arg="runlocal", **overrides):
  config = load_module(ROOT / "configs" / "cokl.py").get_config(arg)
  config.update(dict(eval_every=100, **overrides))
  return config


def test_cokl_caches_reference_answers_and_resumes_exactly(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config(init_from=init), tmp_path / "straight")
  records = [r for r in read_metrics(tmp_path / "straight") if "train/loss" in r]
  sampled = [r["cokl/ref_prompts_sampled"] for r in records]
  reg = straight.parts["regularizer"]
  assert sum(sampled) == reg.tried.sum() and sampled[0] == 2  # each prompt sampled once
  assert all("train/cokl_loss" in r for r in records)

  train_grpo(_config(init_from=init, steps=2), tmp_path / "resumed")
  resumed = train_grpo(_config(init_from=init), tmp_path / "resumed")
  again = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  np.testing.assert_array_equal(resumed.parts["regularizer"].tried, reg.tried)
  np.testing.assert_array_equal(resumed.parts["regularizer"].cache.count, reg.cache.count)
  for key in ("train/loss", "train/cokl_loss", "cokl/ref_prompts_sampled"):
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in records], key


@pytest.mark.parametrize("overrides, match", [
  ({"loss.beta": 0.04}, "config.loss.beta = 0"),
  ({"ppo_mini_batches": 2}, "config.ppo_mini_batches = 1"),
  ({"regularizer.per_prompt": 0}, "config.regularizer.per_prompt must be >= 1"),
  ({"regularizer.name": "l2"}, "config.regularizer.name='l2'"),
])
def test_cokl_config_errors_name_the_key(overrides, match):
  config = _config()
  for key, value in overrides.items():
    if "." in key:
      section, name = key.split(".")
      config[section][name] = value
    else:
      config[key] = value
  with pytest.raises(ValueError, match=match):
    cokl_regularizer.build_regularizer(config)
