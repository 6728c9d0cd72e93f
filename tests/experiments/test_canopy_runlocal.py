"""experiments/rtpo.py with configs/canopy.py in runlocal mode: the pilot, CANOPY metrics, a
resume with more steps (no second pilot); the sweep; the protocol checks at build time."""

import os
from pathlib import Path

import pytest
from runlocal_helpers import budget_records, run_binary, subprocess_env

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "canopy.py"
CANOPY_KEYS = ("canopy/quarantined", "canopy/coverage", "canopy/adv_abs_mean", "train/kl")
PILOT_KEYS = ("canopy/pilot_success", "canopy/pilot_coverage", "canopy/min_group_size")


def _run(env, workdir, *extra, ok=True):
  return run_binary("rtpo.py", f"{CONFIG}:runlocal,horizon=2", workdir, env, *extra, ok=ok)


def test_canopy_runlocal_pilots_logs_and_resumes(tmp_path):
  env = subprocess_env(tmp_path / "xla_cache")
  workdir = tmp_path / "run"
  result = _run(env, workdir)
  train = budget_records(workdir)
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    assert all(key in r for key in CANOPY_KEYS), sorted(r)
    assert 0 <= r["canopy/coverage"] <= 1 and 0 <= r["canopy/quarantined"] <= 1
    # One update per rollout batch on the trainer's own log-probs: ratio 1.
    assert r["train/num_updates"] == 1 and abs(r["train/consistency_ratio"] - 1.0) < 1e-3
    assert r["train/kl"] >= 0
  # The pilot (4 sampled episodes of the untrained `tiny`) ran once, before step 1; with no
  # success it certifies no group size, which runlocal only warns about.
  assert all(key in train[0] for key in PILOT_KEYS)
  assert not any(key in train[1] for key in PILOT_KEYS)
  assert 0 <= train[0]["canopy/pilot_success"] <= 1
  if train[0]["canopy/pilot_success"] == 0:
    assert train[0]["canopy/min_group_size"] == -1
    assert "config.group_size=4" in result.stderr
  assert "canopy K=2: held-out greedy success" in result.stdout
  _run(env, workdir, "--config.steps=3")
  again = budget_records(workdir)
  assert [r["step"] for r in again] == [1, 2, 3]
  assert all(key in again[-1] for key in CANOPY_KEYS)
  assert not any(key in again[-1] for key in PILOT_KEYS)  # a resumed run does not re-pilot
  for key in ("canopy/coverage", "budget/generated_tokens", "rollout/success"):
    assert again[1][key] == pytest.approx(train[1][key]), key


def test_canopy_refuses_a_small_group_and_two_mini_batches(tmp_path):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  # Enforced, the pilot stops the run before training, naming config.group_size: whatever the
  # pilot's p̂ over 4 episodes (0 for the untrained `tiny`), τ = 0.999 needs far more than 4.
  failed = _run(env, tmp_path / "enforced", "--config.canopy.enforce_group_size=True",
                "--config.canopy.coverage_target=0.999", "--config.group_size=4", ok=False)
  assert failed.returncode != 0 and "config.group_size=4" in failed.stderr
  assert not (tmp_path / "enforced" / "checkpoints" / "1").exists()
  # Two mini-batches are not CANOPY's one on-policy update.
  failed = _run(env, tmp_path / "minibatches", "--config.ppo_mini_batches=2", ok=False)
  assert failed.returncode != 0 and "config.ppo_mini_batches=2" in failed.stderr


def test_canopy_sweep_is_the_host_and_ablations_over_three_seeds():
  module = load_module(CONFIG)
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert len(added) == 15 and [a["seed"] for a in added[::5]] == [0, 1, 2]
  assert [a["method"] for a in added[:5]] == ["turn_grpo"] + ["canopy"] * 4
  assert [a.get("ablation", "none") for a in added[:5]] == [
    "none", "none", "g4", "no_kl", "seq_norm"]
  g4, no_kl, seq_norm = (module.get_config(f"ablation={a}") for a in ("g4", "no_kl", "seq_norm"))
  assert g4.group_size == 4 and not g4.canopy.enforce_group_size and g4.loss.beta == 1e-4
  assert no_kl.loss.beta == 0.0 and no_kl.group_size == 8
  assert seq_norm.loss.loss_agg_mode == "seq-mean-token-mean" and seq_norm.loss.beta == 1e-4
  with pytest.raises(ValueError, match="unknown ablation 'no_clip'"):
    module.get_config("ablation=no_clip")
  config = module.get_config("")
  assert config.method == "canopy" and config.group_size == 8 and config.loss.beta == 1e-4
  assert config.loss.kl_estimator == "k3" and config.loss.loss_agg_mode == "token-mean"
  assert config.ppo_epochs == config.ppo_mini_batches == 1
  assert config.canopy.enforce_group_size and config.canopy.pilot_episodes == 64
  assert module.get_config("method=sft").loss.beta == 0.0
  with pytest.raises(ValueError, match="unknown env"):
    module.get_config("env=webshop")
  # The low-success group-size study's words.
  sized = module.get_config("group=32,prompts=2")
  assert (sized.group_size, sized.prompts_per_step) == (32, 2)
  assert sized.canopy.enforce_group_size  # still checked unless the run turns it off
  with pytest.raises(ValueError, match="group=-1"):
    module.get_config("group=-1")
