"""Held-out evaluation of a policy on a verifiable task, and paired comparisons of two evaluations.

    evaluation = evaluate(sampler, params, task, records, max_new_tokens=64, k=8)
    gain, se = paired_gain(before.sample_correct, after.sample_correct)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import Sampler
from jaxrl_post.tasks.base import Task


class Evaluation(NamedTuple):
  """Held-out results: scalar `metrics` and the per-prompt outcomes behind them.

  `greedy_correct` is `[prompts]`; `sample_correct` is `[prompts, k]` (empty
  when k = 0). NaN marks a verifier failure. Per-prompt outcomes let two
  evaluations of the same prompts be compared pairwise (`paired_gain`).
  """

  metrics: dict[str, float]
  greedy_correct: np.ndarray
  sample_correct: np.ndarray


def evaluate(sampler: Sampler, state, task: Task, records: Sequence[Mapping[str, Any]], *,
             max_new_tokens: int, k: int = 4, temperature: float = 1.0,
             rng: jax.Array | None = None, timeout_s: float | None = None) -> Evaluation:
  """Held-out greedy accuracy and format rate; pass@k and mean sample accuracy at `temperature`."""
  prompts = [r["prompt"] for r in records]
  greedy = sampler.generate(state, prompts, max_new_tokens=max_new_tokens, greedy=True)
  correct, fmt, _ = rewards_for(task, records, sampler.decode_text(greedy), 1,
                               timeout_s=timeout_s)
  metrics = {"accuracy": float(np.nanmean(correct)), "format": float(np.nanmean(fmt))}
  correct_k = np.zeros((len(records), 0), np.float32)
  if k:
    rng = jax.random.key(0) if rng is None else rng
    sampled = sampler.generate(state, prompts, n_samples_per_prompt=k,
                               max_new_tokens=max_new_tokens, temperature=temperature, rng=rng)
    correct_k, _, _ = rewards_for(task, records, sampler.decode_text(sampled), k,
                                  timeout_s=timeout_s)
    correct_k = correct_k.reshape(-1, k)
    metrics[f"pass_at_{k}"] = float(np.mean(np.nanmax(correct_k, axis=1) > 0.5))
    # Mean correctness of the k samples (pass@1 at `temperature`): what the RL
    # objective raises, and k times less noisy than the greedy accuracy.
    metrics["sample_accuracy"] = float(np.nanmean(correct_k))
  return Evaluation(metrics, np.asarray(correct, np.float32), np.asarray(correct_k, np.float32))


def sample_pass_rates(sampler: Sampler, state, task: Task,
                      records: Sequence[Mapping[str, Any]], *, samples: int,
                      max_new_tokens: int, temperature: float = 1.0,
                      rng: jax.Array | None = None, prompts_per_call: int = 64,
                      timeout_s: float | None = None) -> np.ndarray:
  """Each record's mean verifier correctness over `samples` sampled completions: `[records]`.

  What task-level statistics are made of (TrajVal's endpoint rewards r_e / r_l, arXiv
  2608.09217; a pilot's success rate for group sizing). Prompts go to the sampler
  `prompts_per_call` at a time (the last call padded with repeats, so every call has one
  shape); a record whose every verifier call failed gets NaN.
  """
  if samples < 1:
    raise ValueError(f"samples must be >= 1, got {samples}")
  rng = jax.random.key(0) if rng is None else rng
  rates = np.full(len(records), np.nan, np.float32)
  for start in range(0, len(records), prompts_per_call):
    chunk = list(records[start:start + prompts_per_call])
    real = len(chunk)
    chunk += [chunk[-1]] * (min(prompts_per_call, len(records)) - real)
    out = sampler.generate(state, [r["prompt"] for r in chunk], n_samples_per_prompt=samples,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           rng=jax.random.fold_in(rng, start))
    correct, _, _ = rewards_for(task, chunk, sampler.decode_text(out), samples,
                                timeout_s=timeout_s)
    with warnings.catch_warnings():  # all-NaN rows stay NaN
      warnings.simplefilter("ignore", RuntimeWarning)
      rates[start:start + real] = np.nanmean(correct.reshape(-1, samples), axis=1)[:real]
  return rates


def paired_gain(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
  """Mean per-prompt change in accuracy between two evaluations of the same prompts, and its SE.

  `before`, `after`: `[prompts]` or `[prompts, k]` correctness (NaN = missing).
  Each prompt's accuracy is the mean over its samples; the gain is
  d̄ = mean_p(a_p − b_p) with standard error std(d, ddof=1) / √P. Pairing
  removes the prompt-difficulty variance that dominates an unpaired comparison.
  """
  with warnings.catch_warnings():  # a prompt whose every verifier call failed: NaN, dropped below
    warnings.simplefilter("ignore", RuntimeWarning)
    b = np.nanmean(np.asarray(before, np.float64).reshape(len(before), -1), axis=1)
    a = np.nanmean(np.asarray(after, np.float64).reshape(len(after), -1), axis=1)
  if b.shape != a.shape:
    raise ValueError(f"paired_gain needs the same prompts: {b.shape} vs {a.shape}")
  d = (a - b)[np.isfinite(a - b)]
  if len(d) < 2:
    return float(d.mean()) if len(d) else float("nan"), float("nan")
  return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))
