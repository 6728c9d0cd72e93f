"""experiments/rtpo.py with configs/temporal_grpo.py in runlocal mode: stage metrics, a resume
with more steps; the sweep (Trajectory-GRPO, Stage-Reward GRPO, Temporal GRPO × 3 seeds)."""

from pathlib import Path

import pytest
from runlocal_helpers import budget_records, run_binary, subprocess_env

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "temporal_grpo.py"
# K = 2 hops + the answer: 3 stages.
STAGE_KEYS = ("stage/success_1", "stage/success_2", "stage/success_3", "stage/participation",
              "stage/adv_abs_mean")


def _run(env, workdir, *extra):
  return run_binary("rtpo.py", f"{CONFIG}:runlocal,horizon=2", workdir, env, *extra)


def test_temporal_grpo_runlocal_logs_stage_metrics_and_resumes(tmp_path):
  # Both runs share a persistent compilation cache: the second compiles (almost) nothing.
  env = subprocess_env(tmp_path / "xla_cache")
  workdir = tmp_path / "run"
  result = _run(env, workdir)
  train = budget_records(workdir)
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    assert all(key in r for key in STAGE_KEYS), sorted(r)
    assert "stage/success_4" not in r
    # Chain completion: a later stage is never completed more often than an earlier one.
    assert 1 >= r["stage/success_1"] >= r["stage/success_2"] >= r["stage/success_3"] >= 0
    # Stage 1 has every episode as a participant: V's mean is at least 1/K.
    assert 1 / 3 <= r["stage/participation"] <= 1
    assert r["train/num_updates"] == 1 and abs(r["train/consistency_ratio"] - 1.0) < 1e-3
  assert "temporal_grpo K=2: held-out greedy success" in result.stdout
  # Asked for one more step, the same command resumes from checkpoint 2 and adds step 3.
  _run(env, workdir, "--config.steps=3")
  again = budget_records(workdir)
  assert [r["step"] for r in again] == [1, 2, 3]
  assert all(key in again[-1] for key in STAGE_KEYS)
  for key in ("stage/participation", "budget/generated_tokens", "rollout/success"):
    assert again[1][key] == pytest.approx(train[1][key]), key  # steps 1-2 were not re-run
  assert again[2]["budget/generated_tokens"] == (
    train[1]["budget/generated_tokens"] + again[2]["budget/step_tokens"])


def test_temporal_grpo_sweep_is_three_credit_rules_over_three_seeds():
  module = load_module(CONFIG)
  added = []
  module.sweep(lambda **kw: added.append(kw))
  arms = ("turn_grpo", "stage_reward", "temporal_grpo")
  assert added == [dict(method=m, seed=s) for s in (0, 1, 2) for m in arms]
  # The arms differ only in `config.method` (the sweep overrides it with --config.method).
  configs = [module.get_config(f"method={m}") for m in arms]
  assert configs[2].env == "kv_lookup" and configs[2].env_knobs.horizon == 4
  assert configs[2].loss.epsilon_high == 0.28 and configs[2].temporal_grpo.eps == 1e-6
  for config in configs:
    config.method = "temporal_grpo"
    assert config.to_dict() == configs[2].to_dict()
  assert module.get_config("env=calculator").env == "calculator"
  with pytest.raises(ValueError, match="unknown env"):
    module.get_config("env=webshop")
  assert set(module.metrics()) >= {"eval/success", "stage/success_1", "stage/participation"}
