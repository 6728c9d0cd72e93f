"""experiments/rtpo.py's DRACO mode with configs/draco.py in runlocal mode: DRACO's metrics, and a
run stopped after 2 steps and resumed to 4 logs the 4-step run's records; the sweep."""

from pathlib import Path

import pytest
from runlocal_helpers import budget_records, run_binary, subprocess_env

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "draco.py"
DRACO_KEYS = ("draco/criteria", "draco/kept", "draco/reward_mean", "draco/lenient_flips",
              "draco/fallback", "draco/adv_abs_mean")


def _train(env, workdir, steps):
  # K = 2 hops + the answer (3 stage criteria); a lenient judge so that the flips are drawn.
  run_binary("rtpo.py", f"{CONFIG}:runlocal,horizon=2,leniency=0.3", workdir, env,
             f"--config.steps={steps}", "--config.eval_every=100", "--config.eval_sampled=False")
  return budget_records(workdir)


def test_draco_runlocal_logs_and_resumes_exactly(tmp_path):
  # The runs share a persistent compilation cache: the later ones compile (almost) nothing.
  env = subprocess_env(tmp_path / "xla_cache")
  straight = _train(env, tmp_path / "straight", 4)
  assert [r["step"] for r in straight] == [1, 2, 3, 4]
  for r in straight:
    assert all(key in r for key in DRACO_KEYS), sorted(r)
    # 3 stage criteria, plus at most the 2 execution-derived ones.
    assert 3 <= r["draco/criteria"] <= 5 and 0 <= r["draco/kept"] <= r["draco/criteria"]
    assert -1 <= r["draco/reward_mean"] <= 1 and 0 <= r["draco/lenient_flips"] <= 1
    assert r["train/num_updates"] == 1
  assert any(r["draco/lenient_flips"] > 0 for r in straight)
  _train(env, tmp_path / "resumed", 2)
  resumed = _train(env, tmp_path / "resumed", 4)
  assert [r["step"] for r in resumed] == [1, 2, 3, 4]
  for key in (*DRACO_KEYS, "train/loss", "rollout/success", "budget/generated_tokens"):
    assert [r[key] for r in resumed] == [r[key] for r in straight], key


def test_draco_sweep_and_arms():
  module = load_module(CONFIG)
  added = []
  module.sweep(lambda **kw: added.append(kw))
  arms = ("turn_grpo", "draco_static", "draco")
  assert added == [dict(method=m, seed=s) for s in (0, 1, 2) for m in arms]
  configs = [module.get_config(f"method={m}") for m in arms]
  assert configs[2].env == "kv_lookup" and configs[2].env_knobs.horizon == 4
  assert configs[2].draco.to_dict() == {"leniency": 0.0, "eps": 1e-8}
  for config in configs:
    config.method = "draco"
    assert config.to_dict() == configs[2].to_dict()
  assert module.get_config("leniency=0.304").draco.leniency == module.SELF_JUDGE_LENIENCY
  assert module.get_config("env=calculator").env == "calculator"
  with pytest.raises(ValueError, match="unknown env"):
    module.get_config("env=webshop")
  assert {"eval/success", "draco/reward_mean", "draco/fallback"} <= set(module.metrics())
