"""GRPO with asynchronous rollouts, dynamic sampling and the true on-policy check (runlocal).

`config.rollout` (`training.async_rollouts`) and `config.dynamic_sampling`
(`methods.group_source`) on the one loop, from a policy with a non-zero reward signal.
"""

from pathlib import Path

import ml_collections
import numpy as np
import pytest
from runlocal_helpers import train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import group_source
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/loss", "train/grad_norm", "train/reward_format", "rollout/logp_abs_diff_max",
            "rollout/completion_length_mean")


def _config(init, *, rollout=None, **overrides):
  config = load_module(ROOT / "configs" / "grpo_arith.py").get_config("runlocal")
  config.unlock()
  config.update(dict(dict(eval_every=100, init_from=str(init), steps=3, prompts_per_step=4,
                          log_every=1), **overrides))
  if rollout is not None:
    config.rollout = ml_collections.ConfigDict(rollout)
  return config


def _train_both(tmp_path, init, first: dict, second: dict):
  """Trains two configs from `init` and returns their training records, after checking that
  the first run had a real signal and that both sampled the same completions (rewards and
  lengths step by step): what remains to compare is the update."""
  records = []
  for name, overrides in (("first", first), ("second", second)):
    config = _config(init, **overrides)
    loop.train(config, tmp_path / name, GRPO(config))
    records.append(train_records(tmp_path / name))
  want, got = records
  assert max(r["train/grad_norm"] for r in want) > 1e-3
  for a, b in zip(want, got, strict=True):
    assert a["train/reward_format"] == b["train/reward_format"]
    assert a["rollout/completion_length_mean"] == b["rollout/completion_length_mean"]
  return want, got


def test_async_with_nothing_in_flight_equals_sync_and_one_step_off_is_one_version_old(
    tmp_path, format_writer_policy):
  # The synchronous run also checks that the sampler's log-probs equal the trainer's bitwise:
  # they do on the tests' 8-device CPU mesh in float32 (on one device they differ by ~1e-6:
  # the CPU matmul blocks a decode step and the full pass differently).
  sync_config = _config(format_writer_policy, rollout=dict(true_on_policy=True))
  loop.train(sync_config, tmp_path / "sync", GRPO(sync_config))
  on_demand = _config(format_writer_policy, rollout=dict(mode="async", max_in_flight=0))
  loop.train(on_demand, tmp_path / "k0", GRPO(on_demand))
  sync, k0 = train_records(tmp_path / "sync"), train_records(tmp_path / "k0")
  assert max(r["train/grad_norm"] for r in sync) > 1e-3  # a real signal is compared
  for a, b in zip(sync, k0, strict=True):
    assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
    assert b["rollout/staleness_max"] == 0
    assert a["rollout/on_policy_abs_diff_max"] == 0.0

  # One step off, with the truncated-IS correction on the sampler's log-probs and the weight
  # sync verified value by value; then stopped after step 2 and resumed to step 4.
  config = _config(format_writer_policy, steps=2, checkpoint_every=2,
                   rollout=dict(mode="one_step_off", verify_sync=True),
                   loss=dict(name="grpo", sampler_correction="truncate", sampler_max=2.0))
  workdir = tmp_path / "one_step_off"
  loop.train(config, workdir, GRPO(config))
  config = _config(format_writer_policy, steps=4, checkpoint_every=2,
                   rollout=dict(mode="one_step_off", verify_sync=True),
                   loss=dict(name="grpo", sampler_correction="truncate", sampler_max=2.0))
  loop.train(config, workdir, GRPO(config))
  records = train_records(workdir)
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  # Step 1 samples with θ0; then θ_{t-2}; after the restart the in-flight batch is drawn again
  # from the same prompts and sampled with the restored θ2 (step 3 fresh), then one off again.
  assert [r["rollout/staleness_max"] for r in records] == [0, 1, 0, 1]
  assert [r["rollout/redrawn_after_restart"] for r in records] == [0, 0, 1, 1]
  assert all(r["sync/buckets"] >= 1 and r["time/weight_sync"] > 0 for r in records)
  assert records[1]["rollout/logp_abs_diff_max"] > 0  # sampled by θ0, scored by θ1


def test_dynamic_sampling_never_hands_out_an_all_equal_group(tmp_path, format_writer_policy,
                                                             monkeypatch):
  seen = []
  take = group_source.GroupSource.take

  def spy(self, state, step, timings):
    groups = take(self, state, step, timings)
    seen.append(np.asarray(groups.verified.format).reshape(-1, self.method.config.group_size))
    return groups

  monkeypatch.setattr(group_source.GroupSource, "take", spy)
  # With the sampler's log-probs as old_logp: no trainer scoring pass, no agreement metric.
  config = _config(format_writer_policy, dynamic_sampling=ml_collections.ConfigDict(
    dict(max_rounds=12)), rollout=dict(mode="one_step_off", old_logp="sampler"))
  loop.train(config, tmp_path / "ds", GRPO(config))
  records = train_records(tmp_path / "ds")
  assert not any("rollout/logp_abs_diff_max" in r for r in records)
  assert len(seen) == 3 and all(g.shape == (4, 4) for g in seen)
  for groups in seen:
    assert np.all(groups.max(axis=1) > groups.min(axis=1))
  assert any(r["dynamic_sampling/rounds"] > 1 for r in records)
  assert all(r["dynamic_sampling/groups_seen"] - r["dynamic_sampling/groups_dropped"]
             - r["dynamic_sampling/groups_surplus"] == 4 for r in records)

  config = _config(format_writer_policy, steps=1,
                   dynamic_sampling=ml_collections.ConfigDict(dict(max_rounds=1)),
                   prompts_per_step=8)
  with pytest.raises(RuntimeError, match="config.dynamic_sampling.max_rounds=1"):
    loop.train(config, tmp_path / "ds_short", GRPO(config))


def test_continuous_batching_gives_the_static_batch_s_step(tmp_path, format_writer_policy):
  # config.rollout.num_slots: the rows decode through 4 slots (32 rows queue for them), each
  # with its own key, so the step sees the static batch's completions (log-probs within float
  # rounding) and trains the same.
  want, got = _train_both(tmp_path, format_writer_policy, dict(steps=2),
                          dict(steps=2, rollout=dict(num_slots=4, admit_size=2, mode="sync")))
  for a, b in zip(want, got, strict=True):
    assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-4, abs=1e-6)
  with pytest.raises(ValueError, match=r"config.rollout.num_slots=-1 must be >= 0"):
    GRPO(_config(format_writer_policy, rollout=dict(num_slots=-1)))


def test_detached_old_logp_trains_like_the_scored_old_policy(tmp_path, format_writer_policy):
  # config.rollout.old_logp="detached": a step of one update takes the loss's own log-probs
  # under stop_gradient as the old policy instead of a scoring pass with the same parameters.
  # The ratio is then exactly 1 rather than 1 up to the two forwards' rounding, so the steps
  # agree to float rounding, not bitwise.
  want, got = _train_both(tmp_path, format_writer_policy, dict(ppo_mini_batches=1),
                          dict(ppo_mini_batches=1, rollout=dict(old_logp="detached")))
  for a, b in zip(want, got, strict=True):
    for key in ("train/loss", "train/grad_norm"):
      assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert "rollout/logp_abs_diff_max" in a and "rollout/logp_abs_diff_max" not in b
    # The ratio is exactly 1 (as float32 exp(0)): nothing is clipped.
    assert b["train/ratio_mean"] == 1.0
    assert b["train/clip_frac_low"] == b["train/clip_frac_high"] == 0.0

  with pytest.raises(ValueError, match=r"old_logp='detached' equals .* = 2"):
    GRPO(_config(format_writer_policy, rollout=dict(old_logp="detached")))
  # RAPO's per-sample scale reads old_logp on the host: it needs the scoring pass.
  rapo = _config(format_writer_policy, ppo_mini_batches=1, rollout=dict(old_logp="detached"))
  rapo.sample_scale = ml_collections.ConfigDict(dict(
    name="rapo", kappa=2.0, lam_min=0.2, normalise="zscore", sensitivity="sampled",
    binary=True))
  with pytest.raises(ValueError, match=r"config.sample_scale reads or rewrites the batch"):
    loop.train(rapo, tmp_path / "rapo", GRPO(rapo))
