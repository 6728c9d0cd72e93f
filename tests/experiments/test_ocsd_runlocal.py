"""experiments/ocsd.py in runlocal mode: OCSD metrics, a resume with more steps; the sweep."""

from pathlib import Path

import pytest
from runlocal_helpers import budget_records, run_binary, subprocess_env

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ocsd.py"
OCSD_KEYS = ("ocsd/q_mean", "ocsd/q_abs_mean", "ocsd/selected_frac", "ocsd/adv_factor_mean",
             "time/ocsd_score")


def _run(env, workdir, *extra):
  return run_binary("ocsd.py", f"{CONFIG}:runlocal,horizon=2", workdir, env, *extra)


def test_ocsd_runlocal_logs_its_metrics_and_resumes_with_more_steps(tmp_path):
  # Both runs share a persistent compilation cache: the second compiles (almost) nothing.
  env = subprocess_env(tmp_path / "xla_cache")
  workdir = tmp_path / "run"
  result = _run(env, workdir)
  train = budget_records(workdir)
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    assert all(key in r for key in OCSD_KEYS), sorted(r)
    # K = 2 (+1 answer, +1 spare) turns: at least one step of every episode is recalibrated.
    assert 0.25 <= r["ocsd/selected_frac"] <= 1.0
    assert 0.5 <= r["ocsd/adv_factor_mean"] <= 1.5 and -1 <= r["ocsd/q_mean"] <= 1
    assert 0 <= r["ocsd/q_abs_mean"] <= 1 and r["time/ocsd_score"] > 0
    # The host is turn GRPO: rows on the recorded contexts, ratio 1.
    assert r["train/num_updates"] == 1 and abs(r["train/consistency_ratio"] - 1.0) < 1e-3
  assert "ocsd K=2: held-out greedy success" in result.stdout
  # Asked for one more step, the same command resumes from checkpoint 2 and adds step 3.
  _run(env, workdir, "--config.steps=3")
  again = budget_records(workdir)
  assert [r["step"] for r in again] == [1, 2, 3]
  assert all(key in again[-1] for key in OCSD_KEYS)
  for key in ("ocsd/q_mean", "budget/generated_tokens", "rollout/success"):
    assert again[1][key] == pytest.approx(train[1][key]), key  # steps 1-2 were not re-run
  assert again[2]["budget/generated_tokens"] == (
    train[1]["budget/generated_tokens"] + again[2]["budget/step_tokens"])
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                if p.name.isdigit())[-1] == 3


def test_ocsd_sweep_is_grpo_vs_ocsd_over_three_seeds():
  module = load_module(CONFIG)
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert added == [dict(method=m, seed=s) for s in (0, 1, 2) for m in ("turn_grpo", "ocsd")]
  # The arms differ only in `config.method` (the sweep overrides it with --config.method).
  ocsd, grpo = module.get_config(""), module.get_config("method=turn_grpo")
  assert ocsd.method == "ocsd" and ocsd.env == "kv_lookup" and ocsd.env_knobs.horizon == 4
  ocsd.method = "turn_grpo"
  assert ocsd.to_dict() == grpo.to_dict()
  assert module.get_config("env=calculator").env == "calculator"
  with pytest.raises(ValueError, match="unknown env"):
    module.get_config("env=webshop")
  assert (ROOT / "experiments" / "ocsd.py").exists()
