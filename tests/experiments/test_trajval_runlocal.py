"""TrajVal on the one loop (configs/trajval.py, runlocal): a probe run, then GRPO drawing its
prompts from the endpoint prior; a run stopped and resumed repeats the uninterrupted one exactly
and does not score the pool again (the prior is in the checkpoint's method arrays)."""

from pathlib import Path

import numpy as np
from runlocal_helpers import train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.tasks import trajval_weights
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _config(arg, **overrides):
  config = load_module(ROOT / "configs" / "trajval.py").get_config(arg)
  config.update(overrides)
  return config


def test_trajval_probe_then_prior_and_exact_resume(tmp_path, format_writer_policy):
  init = str(format_writer_policy)
  train_grpo(_config("runlocal,probe", init_from=init), tmp_path / "probe")
  config = _config("runlocal", init_from=init, eval_every=100)
  config.task_prior.probe = str(tmp_path / "probe")
  straight = train_grpo(config, tmp_path / "straight")
  prior = straight.parts["task_prior"]
  assert prior.ready and prior.r_early.shape == (16,)
  np.testing.assert_allclose(prior.loader.probs, trajval_weights(
    prior.r_early, prior.r_late, gamma=0.3, floor=0.05), rtol=1e-6)
  records = read_metrics(tmp_path / "straight")
  scored = [r["step"] for r in records if "prior/r_early" in r]
  assert scored == [1]

  # Stopped after step 2 (a checkpoint), then the full command again.
  short = _config("runlocal", init_from=init, eval_every=100, steps=2)
  short.task_prior.probe = str(tmp_path / "probe")
  train_grpo(short, tmp_path / "resumed")
  resumed = train_grpo(config, tmp_path / "resumed")
  again = read_metrics(tmp_path / "resumed")
  assert [r["step"] for r in again if "prior/r_early" in r] == [1]  # not scored again
  np.testing.assert_array_equal(resumed.parts["task_prior"].r_early, prior.r_early)
  np.testing.assert_array_equal(resumed.parts["task_prior"].loader.probs, prior.loader.probs)
  for key in ("train/loss", "train/reward_correct", "train/grad_norm"):
    want = [(r["step"], r[key]) for r in records if key in r]
    assert [(r["step"], r[key]) for r in again if key in r] == want, key
