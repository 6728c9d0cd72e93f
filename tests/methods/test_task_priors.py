"""methods/task_priors.py: TrajVal's endpoint prior and RAPO's risk buckets as parts of a GRPO
method — what they compute, when, what they checkpoint, and their config errors."""

import types

import ml_collections
import numpy as np
import pytest

from jaxrl_post.methods import task_priors
from jaxrl_post.tasks import bucket_probs, get_task, trajval_weights


def _config(name, **knobs):
  config = ml_collections.ConfigDict(dict(
    num_train_examples=12, prompts_per_step=3, seed=0, max_new_tokens=8, temperature=1.0,
    reward_timeout_s=None))
  config.task_prior = ml_collections.ConfigDict(dict(name=name, **knobs))
  return config


def _trajval_config(**knobs):
  return _config("trajval", **{"probe": "/probe", "samples": 2, "prompts_per_call": 4,
                               "gamma": 0.3, "floor": 0.05, **knobs})


def test_build_and_errors():
  task = get_task("arith")
  assert task_priors.build_task_prior(_config("uniform"), task) is None
  with pytest.raises(ValueError, match="config.task_prior.name='bogus'"):
    task_priors.build_task_prior(_config("bogus"), task)
  with pytest.raises(ValueError, match="config.task_prior.probe"):
    task_priors.build_task_prior(_trajval_config(probe=""), task)
  with pytest.raises(ValueError, match="config.task_prior.refresh_every"):
    task_priors.build_task_prior(_config("rapo_bucket", refresh_every=0, bucket_probs=(
      0.8, 0.15, 0.05), uniform_mix=0.2), task)
  with pytest.raises(FileNotFoundError, match="config.task_prior.probe="):
    task_priors.probe_params("/nonexistent/probe", {})


def test_trajval_scores_the_pool_once_at_the_start_and_round_trips(monkeypatch):
  rng = np.random.default_rng(0)
  early, late = rng.uniform(size=12).astype(np.float32), rng.uniform(size=12).astype(np.float32)
  calls = []

  def fake_rates(sampler, params, task, records, **kwargs):
    calls.append((params, len(records), kwargs["samples"]))
    return early if params == "start" else late

  monkeypatch.setattr(task_priors, "sample_pass_rates", fake_rates)
  monkeypatch.setattr(task_priors, "probe_params", lambda path, like: "probe")
  method = types.SimpleNamespace(sampler=None, evaluator=types.SimpleNamespace(
    sampler_params=lambda p: (p, 0.0)))
  prior = task_priors.build_task_prior(_trajval_config(), get_task("arith"))
  np.testing.assert_allclose(prior.loader.probs, 1 / 12)  # uniform until scored
  metrics = prior.begin_step(method, types.SimpleNamespace(params="start"), 1)
  assert calls == [("start", 12, 2), ("probe", 12, 2)]
  want = np.asarray(trajval_weights(early, late, gamma=0.3, floor=0.05))
  np.testing.assert_allclose(prior.loader.probs, want, rtol=1e-6)
  v = (1 - early) * np.maximum(late - early, 0)
  assert metrics["prior/learnable_fraction"] == pytest.approx(np.mean(v > 0))
  assert prior.begin_step(method, types.SimpleNamespace(params="start"), 2) == {}
  assert len(calls) == 2  # static: scored once

  restored = task_priors.build_task_prior(_trajval_config(), get_task("arith"))
  restored.load_array_state(prior.array_state())
  np.testing.assert_array_equal(restored.loader.probs, prior.loader.probs)
  assert restored.begin_step(method, types.SimpleNamespace(params="start"), 3) == {}
  assert len(calls) == 2  # a resumed run does not score again


def test_risk_buckets_refresh_from_observed_risks():
  config = _config("rapo_bucket", refresh_every=2, bucket_probs=(0.8, 0.15, 0.05),
                   uniform_mix=0.2)
  prior = task_priors.build_task_prior(config, get_task("arith"))
  assert prior.begin_step(None, None, 1) == {}
  risk = np.linspace(0.05, 0.95, 6).astype(np.float32)
  prior.observe(np.arange(6), risk)
  assert prior.begin_step(None, None, 2) == {}  # not a refresh step (1, 3, 5, ...)
  metrics = prior.begin_step(None, None, 3)
  assert metrics["prior/seen_fraction"] == pytest.approx(0.5)
  filled = np.concatenate([risk, np.full(6, np.median(risk))])
  np.testing.assert_allclose(prior.loader.probs, bucket_probs(filled), rtol=1e-6)
  assert prior.loader.probs[0] > prior.loader.probs[5]  # low risk is drawn more
  restored = task_priors.build_task_prior(config, get_task("arith"))
  restored.load_array_state(prior.array_state())
  np.testing.assert_array_equal(restored.loader.probs, prior.loader.probs)
  np.testing.assert_array_equal(restored.risk, prior.risk)
