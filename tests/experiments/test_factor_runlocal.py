"""experiments/rtpo.py's FACTOR mode with configs/factor.py in runlocal mode: FACTOR's metrics,
the continuations in the token budget, and a run stopped after 2 steps and resumed to 4 logs the
4-step run's records; the sweep."""

from pathlib import Path

import pytest
from runlocal_helpers import budget_records, run_binary, subprocess_env

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "factor.py"
FACTOR_KEYS = ("factor/eta", "factor/continuations", "factor/continuation_tokens",
               "factor/astar_abs_mean", "factor/astar_sum_gap", "factor/multiplier_dev",
               "factor/sign_agree", "factor/delta_mean")


BUDGET = 10**6  # generated tokens: never reached in 4 steps, so η follows the fraction spent


def _train(env, workdir, steps, budget=BUDGET):
  # The untrained `tiny` never succeeds, so every group's returns are equal: without the std
  # division (standardize=False) the rollouts are still continued from their checkpoints.
  run_binary("rtpo.py", f"{CONFIG}:runlocal,horizon=2,budget={budget}", workdir, env,
             f"--config.steps={steps}", "--config.eval_every=100", "--config.eval_sampled=False",
             "--config.factor.standardize=False")
  return budget_records(workdir)


def test_factor_runlocal_logs_and_resumes_exactly(tmp_path):
  # The runs share a persistent compilation cache: the later ones compile (almost) nothing.
  env = subprocess_env(tmp_path / "xla_cache")
  straight = _train(env, tmp_path / "straight", 4)
  assert [r["step"] for r in straight] == [1, 2, 3, 4]
  for r in straight:
    assert all(key in r for key in FACTOR_KEYS), sorted(r)
    assert r["factor/continuations"] > 0 and r["factor/continuation_tokens"] > 0
    # The budget counts the continuations on top of the episodes.
    assert r["budget/step_tokens"] > r["factor/continuation_tokens"]
    assert r["factor/astar_sum_gap"] < 1e-5 and r["factor/multiplier_dev"] < 1e-5
    assert r["train/num_updates"] == 1
  # With a token budget, η anneals linearly from 0.7 to 0.3 over the fraction of it spent
  # before the step (the run ends at its budget, long before `config.steps`).
  spent = [r["budget/generated_tokens"] - r["budget/step_tokens"] for r in straight]
  assert spent[0] == 0 and spent[1] > 0
  assert [r["factor/eta"] for r in straight] == pytest.approx(
    [0.7 - 0.4 * s / BUDGET for s in spent], abs=1e-6)
  # Without one, over runlocal's 2 steps (fixed when the config is built, so a resumed run with
  # more steps keeps the schedule), then it stays at 0.3.
  unbudgeted = _train(env, tmp_path / "unbudgeted", 3, budget=0)
  assert [r["factor/eta"] for r in unbudgeted] == pytest.approx([0.5, 0.3, 0.3])
  _train(env, tmp_path / "resumed", 2)
  resumed = _train(env, tmp_path / "resumed", 4)
  assert [r["step"] for r in resumed] == [1, 2, 3, 4]
  for key in (*FACTOR_KEYS, "train/loss", "rollout/success", "budget/generated_tokens"):
    assert [r[key] for r in resumed] == [r[key] for r in straight], key


def test_factor_sweep_and_arms():
  module = load_module(CONFIG)
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert added == [dict(method=m, seed=s) for s in (0, 1, 2) for m in ("turn_grpo", "factor")]
  configs = [module.get_config(f"method={m}") for m in ("turn_grpo", "factor")]
  assert configs[1].factor.checkpoints == 2 and configs[1].factor.continuations == 4
  assert configs[1].factor.eta_start == 0.7 and configs[1].factor.eta_end == 0.3
  assert configs[1].factor.eta_steps == configs[1].steps == 200
  for config in configs:
    assert config.loss.loss_agg_mode == "seq-mean-token-mean"
    config.method = "factor"
    assert config.to_dict() == configs[1].to_dict()
  with pytest.raises(ValueError, match="unknown env"):
    module.get_config("env=webshop")
  assert {"eval/success", "factor/eta", "factor/sign_agree"} <= set(module.metrics())
