"""GTN-R on the one loop (configs/gtn_r.py, runlocal): NLL pretraining, then TS-GRPO with each
GTN-R variant; a stopped-and-resumed GRPO run repeats the uninterrupted one."""

import math
from pathlib import Path

import pytest
from runlocal_helpers import same_logged

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.gtn_r import GTNR
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_module(ROOT / "configs" / "gtn_r.py")


def _config(arg="runlocal", **overrides):
  config = CONFIG.get_config(arg)
  # A fixed decay horizon: a 2-step run is then the prefix of the 4-step one.
  config.optimizer.decay_steps = 8
  # Checkpoints only at a run's last step: the 2-step run's is the one the resume starts from.
  config.checkpoint_every = 0
  config.update(overrides)
  return config


def test_config_variants_sweep_and_errors():
  config = CONFIG.get_config("")
  assert (config.stage, config.gtn_r.variant, config.steps) == ("grpo", "neighbourhood_nll", 300)
  assert (config.num_samples, config.horizon, config.context_len) == (16, 8, 32)
  assert CONFIG.get_config("stage=pretrain").steps == 1500
  added = []
  CONFIG.sweep(lambda **kw: added.append(kw))
  assert len(added) == 12 and {kw["seed"] for kw in added} == {0, 1, 2}
  assert {kw.get("variant") for kw in added} == {None, "none", "neighbourhood_nll",
                                                 "anchored_group"}
  assert (config.rng_impl, CONFIG.get_config("runlocal").rng_impl) == ("threefry2x32", "rbg")
  for key, value, message in (("num_samples", 1, "config.num_samples=1"),
                              ("stage", "sft", "config.stage='sft'"),
                              ("rng_impl", "philox", "config.rng_impl='philox'")):
    with pytest.raises(ValueError, match=message):
      GTNR(_config(**{key: value}))
  bad = _config("runlocal,variant=ball")
  with pytest.raises(ValueError, match="config.gtn_r.variant='ball'"):
    GTNR(bad)
  bad = _config("runlocal,stage=pretrain")
  bad.gtn_r.delta = 0.0
  with pytest.raises(ValueError, match="config.gtn_r.delta=0.0 must be > 0"):
    GTNR(bad)
  with pytest.raises(ValueError, match="config.init_from: stage 'grpo'"):
    GTNR(_config())


def test_pretrain_then_grpo_variants_and_exact_resume(tmp_path):
  pre = tmp_path / "pretrain"
  loop.train(_config("runlocal,stage=pretrain"), pre, GTNR(_config("runlocal,stage=pretrain")))
  nll = [r["train/nll"] for r in read_metrics(pre) if "train/nll" in r]
  assert len(nll) == 4 and all(math.isfinite(x) for x in nll)
  assert {"eval/mass_near_truth_hard", "eval/mass_within_2_hard"} <= set(read_metrics(pre)[-1])

  # Variant B with a KL to the start: 4 steps straight, then 2 + 2 after a restart.
  arg = "runlocal,variant=anchored_group"
  config = _config(arg, init_from=str(pre), beta=0.04)
  loop.train(config, tmp_path / "straight", GTNR(config))
  short = _config(arg, init_from=str(pre), beta=0.04, rl_steps=2)
  loop.train(short, tmp_path / "resumed", GTNR(short))
  loop.train(config, tmp_path / "resumed", GTNR(config))
  a = [r for r in read_metrics(tmp_path / "straight") if "train/loss" in r]
  b = [r for r in read_metrics(tmp_path / "resumed") if "train/loss" in r]
  assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
  keys = ("train/loss", "train/grad_norm", "train/kl", "rollout/reward",
          "rollout/anchor_reward", "gtn_r/delta")
  for x, y in zip(a, b):
    for key in keys:
      assert same_logged(x[key], y[key]), (x["step"], key, x[key], y[key])
  assert all(r["rollout/anchor_reward"] > r["rollout/reward"] for r in a)
  evals = [r for r in read_metrics(tmp_path / "resumed") if "eval/mse" in r]
  assert same_logged(evals[-1]["eval/mse"], [r for r in read_metrics(tmp_path / "straight")
                                       if "eval/mse" in r][-1]["eval/mse"])

  # Variant A logs its regulariser and annealed λ, δ.
  config = _config("runlocal,variant=neighbourhood_nll", init_from=str(pre), rl_steps=2)
  loop.train(config, tmp_path / "nll", GTNR(config))
  records = [r for r in read_metrics(tmp_path / "nll") if "train/loss" in r]
  assert all(r["train/neighbourhood_nll"] > 0 for r in records)
  assert records[0]["gtn_r/lam"] == config.gtn_r.lam > records[1]["gtn_r/lam"]
