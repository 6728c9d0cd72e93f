"""experiments/rtpo.py in runlocal mode: SFT cold start, the three methods, budget stop, resume.

Each run is a subprocess of the real binary. They share a persistent XLA compilation cache, so
the programs the runs have in common (sampler, scoring) compile once for the whole module.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
from runlocal_helpers import budget_records, run_binary, subprocess_env

from jaxrl_post.config_args import load_module
from jaxrl_post.envs import get_env, make_context
from jaxrl_post.models import get_model_config
from jaxrl_post.sampling import multiturn
from jaxrl_post.training.metrics import read_eval_outcomes, read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {name: ROOT / "configs" / f"rtpo_{name}.py" for name in ("calculator", "kv", "kv_fork")}


def _load(path):
  return load_module(path, path.stem)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configs_build_for_every_method_and_horizon(name):
  module = _load(CONFIGS[name])
  tokenizer = multiturn.build_tokenizer("char_tools")
  for method in ("sft", "flat_grpo", "turn_grpo", "rtpo"):
    for horizon in module.HORIZONS:
      config = module.get_config(f"method={method},horizon={horizon}")
      assert config.method == method and config.env_knobs.horizon == horizon
      env = get_env(config.env, **dict(config.env_knobs))
      psi = make_context(config.context.to_dict(), tokenizer=tokenizer)
      assert get_model_config(config.model).vocab_size >= tokenizer.vocab_size
      # Demonstrations fit the lengths: contexts within ψ's budget, turns within the turn
      # budget, and the whole flat history within flat_len (so flat GRPO is not cut).
      for index in range(20):
        turns = multiturn.demonstration_turns(env, [index], tokenizer=tokenizer, context=psi,
                                              max_context_len=config.max_context_len)
        assert not any(t.context_cut for t in turns)
        assert max(len(t.action_ids) for t in turns) <= config.max_turn_tokens
        flat = sum(len(t.action_ids) + len(tokenizer.encode(t.turn.observation)) for t in turns)
        assert flat <= config.flat_len
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert len(added) == 3 * len(module.HORIZONS) * len(module.SEEDS)
  with pytest.raises(ValueError, match="unknown method"):
    module.get_config("method=ppo")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  return subprocess_env(tmp_path_factory.mktemp("xla_cache"))


def _run(env, config, workdir, *extra):
  return run_binary("rtpo.py", config, workdir, env, *extra, timeout=600)


@pytest.fixture(scope="module")
def sft(env, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("sft")
  _run(env, f"{CONFIGS['calculator']}:method=sft,horizon=2,runlocal", workdir)
  return workdir


@pytest.fixture(scope="module")
def rtpo_run(env, sft, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("rtpo")
  result = _run(env, f"{CONFIGS['kv']}:method=rtpo,horizon=2,runlocal", workdir,
                f"--config.init_from={sft}")
  return workdir, result


def test_sft_cold_start(sft):
  train = budget_records(sft)
  assert [r["step"] for r in train] == [1, 2, 3]
  assert all(r["budget/step_tokens"] == 0 and r["train/nll"] > 0 for r in train)
  assert train[-1]["train/nll"] < train[0]["train/nll"]
  assert sorted(int(p.name) for p in (sft / "checkpoints").iterdir() if p.name.isdigit())[-1] == 3
  evals = [r for r in read_metrics(sft) if "eval/success" in r]
  assert [r["step"] for r in evals] == [0, 2, 3]
  # Per-episode outcomes of every evaluation (for paired comparisons across runs): as many as
  # the held-out episodes, and their means are the logged success rates.
  outcomes = read_eval_outcomes(sft)
  assert sorted(outcomes) == [0, 2, 3]
  for record in evals:
    step = outcomes[record["step"]]
    assert len(step["greedy_success"]) == 4  # runlocal's eval_episodes
    assert np.mean(step["greedy_success"]) == pytest.approx(record["eval/success"])
    if "eval/sampled_success" in record:
      assert np.mean(step["sampled_success"]) == pytest.approx(record["eval/sampled_success"])


def test_rtpo_runlocal(rtpo_run):
  workdir, result = rtpo_run
  train = budget_records(workdir)
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    # K = 2 (+1 answer, +1 spare): boundaries k = 3..0, each with 2 trunks × 2 siblings.
    assert r["rtpo/boundaries_visited"] >= 1 and r["train/num_updates"] >= 1
    assert r["boundary/k0/boundaries"] == 4 and "boundary/k0/consistency_ratio" in r
    # Siblings are scored on their recorded contexts: the ratio is 1 up to float noise.
    assert abs(r["train/consistency_ratio"] - 1.0) < 1e-3
  tokens = [r["budget/generated_tokens"] for r in train]
  assert tokens[0] == train[0]["budget/step_tokens"] and tokens[1] == sum(
    r["budget/step_tokens"] for r in train)
  assert "rtpo K=2: held-out greedy success" in result.stdout


def test_flat_grpo_runlocal(env, sft, tmp_path):
  _run(env, f"{CONFIGS['calculator']}:method=flat_grpo,horizon=2,runlocal", tmp_path,
       f"--config.init_from={sft}")
  train = budget_records(tmp_path)
  assert [r["step"] for r in train] == [1, 2]
  assert all(r["train/num_updates"] == 1 and "train/flat_rows_cut" in r for r in train)


def test_turn_grpo_stops_at_the_token_budget(env, sft, tmp_path):
  result = _run(env, f"{CONFIGS['kv']}:method=turn_grpo,horizon=2,runlocal", tmp_path,
                f"--config.init_from={sft}", "--config.max_generated_tokens=1")
  assert "generated-token budget reached" in result.stdout
  (train,) = budget_records(tmp_path)
  assert train["step"] == 1 and train["train/num_updates"] == 1
  assert abs(train["train/consistency_ratio"] - 1.0) < 1e-3
  # The run ends with an evaluation and a checkpoint of the step that used up the budget.
  assert [r["step"] for r in read_metrics(tmp_path) if "eval/success" in r] == [0, 1]
  # Started again, it finds the budget spent and only reports (the grid script relies on it).
  again = _run(env, f"{CONFIGS['kv']}:method=turn_grpo,horizon=2,runlocal", tmp_path,
               f"--config.init_from={sft}", "--config.max_generated_tokens=1")
  assert "held-out greedy success" in again.stdout and len(budget_records(tmp_path)) == 1


def test_rtpo_resume_gives_the_same_metrics(env, sft, rtpo_run, tmp_path):
  # The finished 2-step run kept checkpoints 1 and 2; without checkpoint 2 its workdir is that
  # of a run killed after step 1's checkpoint. The same command then resumes from step 1 and
  # must log the same step 2 (and keep step 1's record).
  full, _ = rtpo_run
  workdir = tmp_path / "killed"
  shutil.copytree(full, workdir)
  shutil.rmtree(workdir / "checkpoints" / "2")
  _run(env, f"{CONFIGS['kv']}:method=rtpo,horizon=2,runlocal", workdir,
       f"--config.init_from={sft}")
  again, reference = budget_records(workdir), budget_records(full)
  assert [r["step"] for r in again] == [1, 2]
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [
    "1", "2"]
  for a, b in zip(reference, again, strict=True):
    for key, value in a.items():
      if not key.startswith("time/"):
        assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_kv_fork_off_policy_runlocal_with_the_paper_settings(env, sft, tmp_path):
  # The credit-assignment env with RTPO's off-policy-continuation ablation, at the paper's
  # β = 0.02 (KL to the cold start, so reference log-probs are scored), T = 0.9 and ±10 clamp.
  config = _load(CONFIGS["kv_fork"]).get_config("method=rtpo,horizon=2,runlocal")
  assert (config.loss.beta, config.temperature, config.loss.max_log_ratio) == (0.02, 0.9, 10.0)
  assert not config.skip_zero_advantage
  _run(env, f"{CONFIGS['kv_fork']}:method=rtpo,horizon=2,runlocal", tmp_path,
       f"--config.init_from={sft}", "--config.continuation=off_policy")
  train = budget_records(tmp_path)
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    assert r["train/num_updates"] >= 1 and r["boundary/k0/boundaries"] == 4
    # Off-policy: every boundary's siblings carry the clamped weight ω̄ in [ρ_min, ρ_max].
    weights = [v for k, v in r.items() if k.endswith("/weight_mean")]
    assert weights and all(0.5 <= w <= 2.0 for w in weights)
    assert r["train/kl"] >= 0.0
