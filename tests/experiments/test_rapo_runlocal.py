"""RAPO on the one loop (configs/rapo.py, runlocal): R-Scale scales each prompt's advantages by
its λ, R-Bucket redraws the pool from the observed risks, and a stopped-and-resumed run repeats
the uninterrupted one (the risks and the prior are in the checkpoint's method arrays)."""

from pathlib import Path

import numpy as np
from runlocal_helpers import train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _config(arg="runlocal", **overrides):
  config = load_module(ROOT / "configs" / "rapo.py").get_config(arg)
  config.update(dict(eval_every=100, prompts_per_step=4, **overrides))
  return config


def test_rapo_scales_redraws_and_resumes_exactly(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  straight = train_grpo(_config(init_from=init), tmp_path / "straight")
  records = read_metrics(tmp_path / "straight")
  steps = [r for r in records if "train/loss" in r]
  assert all(0.2 <= r["train/rapo_lambda_min"] <= r["train/rapo_lambda_mean"] <= 1.0
             for r in steps)
  # Risks were observed for the drawn tasks, and the prior was refreshed (steps 3, 5, ...).
  assert np.isfinite(straight.parts["task_prior"].risk).sum() >= 4
  assert [r["step"] for r in records if "prior/seen_fraction" in r] == [3]
  assert not np.allclose(straight.parts["task_prior"].loader.probs, 1 / 16)

  train_grpo(_config(init_from=init, steps=2), tmp_path / "resumed")
  resumed = train_grpo(_config(init_from=init), tmp_path / "resumed")
  again = read_metrics(tmp_path / "resumed")
  prior, want = resumed.parts["task_prior"], straight.parts["task_prior"]
  np.testing.assert_array_equal(prior.risk, want.risk)
  np.testing.assert_array_equal(prior.loader.probs, want.loader.probs)
  for key in ("train/loss", "train/rapo_lambda_mean", "train/reward_correct"):
    want = [(r["step"], r[key]) for r in records if key in r]
    assert [(r["step"], r[key]) for r in again if key in r] == want, key
