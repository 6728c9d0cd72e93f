"""Verifier failures and time-outs, PPO mini-batches, and metrics files cut by a kill."""

import json
import time

import numpy as np
import pytest

from jaxrl_post.rewards import verifiers
from jaxrl_post.sampling import score_model
from jaxrl_post.training import evaluation, objectives, ppo
from jaxrl_post.training.metrics import MetricWriter, read_metrics


class _FlakyTask:
  """Reward 1 for "ok", raises for "boom", hangs for "hang"."""

  def reward(self, record, text):
    if text == "boom":
      raise ZeroDivisionError("verifier bug")
    if text == "hang":
      time.sleep(30)
    return float(text == "ok"), 1.0


def test_raising_and_hanging_verifiers_become_missing_rewards():
  texts = ["ok", "boom", "hang", "no"]
  tic = time.perf_counter()
  correct, fmt, failures = verifiers.rewards_for(_FlakyTask(), [{}, {}], texts, 2, timeout_s=0.2)
  assert time.perf_counter() - tic < 5  # the hang was cut at 0.2 s
  np.testing.assert_array_equal(correct, [1.0, np.nan, np.nan, 0.0])
  np.testing.assert_array_equal(fmt, [1.0, np.nan, np.nan, 1.0])
  assert failures == verifiers.RewardFailures(errors=1, timeouts=1) and failures.total == 2


def test_ppo_mini_batches_partition_rows_with_their_own_normalizers():
  rows = 8
  mask = np.zeros((rows, 5), bool)
  for i in range(rows):
    mask[i, :i % 5 + 1] = True  # 1..5 tokens per row
  batch = {"completion_mask": mask, "adv": np.arange(rows, dtype=np.float32)}
  parts = ppo.ppo_mini_batches(batch, 4, np.random.default_rng(0))
  assert len(parts) == 4
  seen = np.sort(np.concatenate([np.asarray(p["adv"]) for p in parts]))
  np.testing.assert_array_equal(seen, np.arange(rows))  # every rollout exactly once
  for part in parts:
    assert part["adv"].shape == (2,)
    assert float(part["num_tokens"]) == part["completion_mask"].sum()
    assert float(part["num_sequences"]) == 2
  # One mini-batch is the whole batch in its original order.
  (whole,) = ppo.ppo_mini_batches(batch, 1, np.random.default_rng(0))
  np.testing.assert_array_equal(whole["adv"], batch["adv"])
  with pytest.raises(ValueError, match="ppo_mini_batches=3"):
    ppo.ppo_mini_batches(batch, 3, np.random.default_rng(0))


def test_mean_update_metrics_keeps_counters():
  updates = [{"loss": 1.0, "skipped": 0.0, "nonfinite_streak": 0.0},
             {"loss": 3.0, "skipped": 1.0, "nonfinite_streak": 1.0}]
  assert ppo.merge_update_metrics(updates) == {"loss": 2.0, "skipped": 1.0,
                                             "nonfinite_streak": 1.0, "num_updates": 2.0}


def test_truncated_last_metrics_line_is_skipped_and_resume_drops_it(tmp_path):
  writer = MetricWriter(tmp_path, tensorboard=False)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  writer.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 4, "loss": 4.0})[:9])  # killed mid-write
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
  writer = MetricWriter(tmp_path, resume_step=2, tensorboard=False)
  writer.write(3, {"loss": 30.0})
  writer.close()
  assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0),
                                                                      (3, 30.0)]
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match="line 2 is not JSON"):
    read_metrics(tmp_path)


def _rollout_batch(lengths, width=72, rows_prompt=4):
  rng = np.random.default_rng(0)
  mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
  return {"prompt_tokens": rng.integers(3, 20, (len(lengths), rows_prompt)).astype(np.int32),
          "prompt_mask": np.ones((len(lengths), rows_prompt), bool),
          "completion_tokens": np.where(mask, rng.integers(3, 20, mask.shape), 0).astype(np.int32),
          "completion_mask": mask, "adv": rng.normal(size=len(lengths)).astype(np.float32)}


@pytest.mark.parametrize("lengths, multiple, width", [
  ((3, 19, 7), 16, 32),   # longest 19 → 32
  ((3, 16, 7), 16, 16),   # exactly a multiple
  ((70, 1), 16, 72),      # never wider than the sampler's width
  ((0, 0), 16, 16),       # nothing generated: one multiple
  ((3, 19, 7), 0, 72),    # 0 turns it off
])
def test_trim_completions_widths(lengths, multiple, width):
  batch = _rollout_batch(lengths)
  trimmed = ppo.trim_completions(batch, multiple)
  assert trimmed["completion_tokens"].shape[1] == trimmed["completion_mask"].shape[1] == width
  assert trimmed["completion_mask"].sum() == batch["completion_mask"].sum()  # no token lost
  np.testing.assert_array_equal(trimmed["prompt_tokens"], batch["prompt_tokens"])
  np.testing.assert_array_equal(trimmed["adv"], batch["adv"])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_trimmed_batch_gives_the_same_loss_and_gradient(mode):
  import jax
  from flax import nnx

  from jaxrl_post.models import CausalLM, get_model_config

  model = CausalLM(get_model_config("tiny", vocab_size=24), rngs=nnx.Rngs(0))
  loss_fn = objectives.make_policy_loss(policy_loss="grpo", loss_agg_mode=mode, max_tokens=72)
  graphdef, params = nnx.split(model)

  def loss_and_grad(batch):
    batch = ppo.with_normalizers(batch)
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                            batch["completion_tokens"], batch["completion_mask"])
    batch["old_logp"] = jax.lax.stop_gradient(scored.logp) - 0.05  # ratios ≠ 1: clipping acts
    return jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p), batch)[0])(params)

  full = _rollout_batch((3, 19, 7, 11), width=40)
  loss, grads = loss_and_grad(full)
  loss_t, grads_t = loss_and_grad(ppo.trim_completions(full, 8))
  np.testing.assert_allclose(loss_t, loss, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_t), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_policy_loss_without_old_logp_is_the_scored_old_policy_s():
  # `config.rollout.old_logp="detached"`: a batch without `old_logp` takes the loss's own
  # log-probs under stop_gradient, which is what scoring with the same parameters gives.
  import jax
  from flax import nnx

  from jaxrl_post.models import CausalLM, get_model_config

  model = CausalLM(get_model_config("tiny", vocab_size=24), rngs=nnx.Rngs(0))
  loss_fn = objectives.make_policy_loss(policy_loss="grpo", beta=0.0)
  graphdef, params = nnx.split(model)
  batch = ppo.with_normalizers(_rollout_batch((3, 19, 7, 11), width=24))
  scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                       batch["completion_tokens"], batch["completion_mask"])

  def loss_and_grad(batch):
    return jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p), batch)[0])(params)

  loss, grads = loss_and_grad(dict(batch, old_logp=scored.logp))
  loss_d, grads_d = loss_and_grad(batch)
  np.testing.assert_allclose(loss_d, loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_d), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
  assert any(np.abs(g).max() > 1e-4 for g in jax.tree.leaves(grads))


def test_rollout_metrics_accept_trainer_logp_of_trimmed_width():
  from jaxrl_post.sampling import rollout_metrics
  from jaxrl_post.sampling.rollout import Rollout

  batch = _rollout_batch((3, 5), width=12)
  logp = np.where(batch["completion_mask"], -0.5, 0.0).astype(np.float32)
  fields = dict(prompt_tokens=batch["prompt_tokens"], prompt_mask=batch["prompt_mask"],
                completion_tokens=batch["completion_tokens"],
                completion_mask=batch["completion_mask"], logp=logp,
                finish_reason=np.zeros(2, np.int32), group_ids=np.arange(2))
  rollout = Rollout(**{k: v for k, v in fields.items() if k in Rollout.__dataclass_fields__})
  metrics = rollout_metrics(rollout, logp[:, :8] + 1e-3)
  np.testing.assert_allclose(metrics["logp_abs_diff_max"], 1e-3, rtol=1e-3)
  with pytest.raises(ValueError, match="covers 4 completion positions"):
    rollout_metrics(rollout, logp[:, :4])


def test_paired_gain_golden():
  # Per-prompt accuracies before (0.5, 0, 1) and after (1, 0.5, 1): d = (0.5, 0.5, 0),
  # d̄ = 1/3, std(d, ddof=1) = √(1/12) = 0.2887, SE = 0.2887 / √3 = 0.1667.
  before = np.array([[1, 0], [0, 0], [1, 1]], np.float32)
  after = np.array([[1, 1], [1, 0], [1, 1]], np.float32)
  gain, se = evaluation.paired_gain(before, after)
  np.testing.assert_allclose([gain, se], [1 / 3, 1 / 6], rtol=1e-6)
  # A prompt whose verifier failed in every sample drops out of the pairing.
  gain, _ = evaluation.paired_gain(np.array([0.0, np.nan, 1.0]), np.array([1.0, 1.0, 1.0]))
  assert gain == 0.5
  with pytest.raises(ValueError, match="same prompts"):
    evaluation.paired_gain(np.zeros(3), np.zeros(4))


def test_ppo_phase_takes_epochs_times_mini_batches_updates_over_every_row():
  rows = 8
  batch = {"completion_mask": np.ones((rows, 3), bool), "adv": np.arange(rows, dtype=np.float32)}
  seen = []

  def step_fn(state, mini_batch):
    seen.append(np.asarray(mini_batch["adv"]))
    return state + 1, {"loss": np.float32(len(seen)), "skipped": np.int32(0),
                       "nonfinite_streak": np.int32(0)}

  state, updates = ppo.ppo_phase(step_fn, 0, batch, epochs=2, mini_batches=4,
                                 rng=np.random.default_rng(0), put=lambda b: b)
  assert state == 8 and len(updates) == 8 and all(len(s) == 2 for s in seen)
  for epoch in (seen[:4], seen[4:]):  # each epoch is a permutation of the rows
    np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(rows))
  assert any((a != b).any() for a, b in zip(seen[:4], seen[4:]))  # reshuffled per epoch
  merged = ppo.merge_update_metrics(updates)
  assert merged == {"loss": 4.5, "skipped": 0.0, "nonfinite_streak": 0.0, "num_updates": 8.0}


class _ScriptedSampler:
  """Stands in for `Sampler`: record i's sample j is "right" when j < record i's `k_right`."""

  def __init__(self):
    self.calls = []

  def generate(self, state, prompts, *, n_samples_per_prompt, **kwargs):
    del state, kwargs
    self.calls.append(len(prompts))
    return [(p, j) for p in prompts for j in range(n_samples_per_prompt)]

  def decode_text(self, out):
    return ["right" if j < int(p.split(":")[1]) else "wrong" for p, j in out]


class _ScriptedTask:

  def reward(self, record, completion):
    if record["prompt"].startswith("broken"):
      raise RuntimeError("verifier bug")
    return float(completion == "right"), 1.0


def test_sample_pass_rates_chunks_pads_and_averages():
  k_right = [0, 1, 2, 3, 4, 0, 4]
  records = [{"prompt": f"p{i}:{k}"} for i, k in enumerate(k_right)]
  records[5] = {"prompt": "broken:0"}
  sampler = _ScriptedSampler()
  rates = evaluation.sample_pass_rates(sampler, None, _ScriptedTask(), records, samples=4,
                                       max_new_tokens=8, prompts_per_call=3)
  np.testing.assert_allclose(rates, [0.0, 0.25, 0.5, 0.75, 1.0, np.nan, 1.0])
  assert sampler.calls == [3, 3, 3]  # the last chunk of one record is padded to the shape
  with pytest.raises(ValueError, match="samples"):
    evaluation.sample_pass_rates(sampler, None, _ScriptedTask(), records, samples=0,
                                 max_new_tokens=8)
