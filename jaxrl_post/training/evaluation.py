"""Held-out evaluation of a policy on a verifiable task, and paired comparisons of two evaluations.

    evaluation = evaluate(sampler, params, task, records, max_new_tokens=64, k=8,
                          pass_ks=(1, 4, 8))
    gain, se = paired_gain(before.sample_correct, after.sample_correct)
    pass_at_k(n=[8, 8], c=[0, 3], k=4)   # the unbiased per-problem estimator
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


def pass_at_k(n, c, k: int) -> np.ndarray:
  """Unbiased pass@k of each problem from `n` samples of which `c` were correct.

  The Codex estimator (Chen et al. 2021, arXiv 2107.03374, eq. 1): the chance that `k` of the
  `n` samples, drawn without replacement, hold at least one correct one,

      pass@k = 1 − C(n − c, k) / C(n, k) = 1 − ∏_{i = n−c+1}^{n} (1 − k / i),

  computed as the product on the right: the binomials overflow float64 from n ≈ 1030 on, the
  product of c factors in (0, 1] does not. It is exact for every k ≤ n (k = n gives "any of the
  n correct"), whereas 1 − (1 − c/n)^k, the plug-in estimate, is biased low.

  Args:
    n: samples per problem, int `[P]` (or a scalar, broadcast).
    c: correct samples per problem, int `[P]`, 0 ≤ c ≤ n.
    k: the k of pass@k, 1 ≤ k ≤ min(n).

  Returns:
    float64 `[P]` (the broadcast shape of `n` and `c`), each in [0, 1].

  Raises:
    ValueError: k > n for some problem (naming both), k < 1, or c outside [0, n].

  >>> pass_at_k(4, [0, 1, 4], 2).tolist()
  [0.0, 0.5, 1.0]
  """
  n, c = np.broadcast_arrays(np.asarray(n, np.int64), np.asarray(c, np.int64))
  k = int(k)
  if k < 1:
    raise ValueError(f"pass@k needs k >= 1, got k={k}")
  if n.size and k > n.min():
    raise ValueError(f"pass@k needs k <= n (samples per problem): k={k}, n={int(n.min())}; "
                     f"draw at least {k} samples per problem or lower k")
  if n.size and ((c < 0) | (c > n)).any():
    raise ValueError(f"pass@k needs 0 <= c <= n; got c in [{int(c.min())}, {int(c.max())}] "
                     f"with n in [{int(n.min())}, {int(n.max())}]")
  if not n.size:
    return np.zeros(n.shape, np.float64)
  # Factor j of problem p is 1 − k / (n_p − j) for j < c_p, else 1: a [P, max c] product.
  j = np.arange(max(int(c.max()), 1))
  i = (n[..., None] - j).astype(np.float64)
  factors = np.where(j < c[..., None], 1.0 - k / np.maximum(i, 1.0), 1.0)
  # A factor is ≤ 0 only when n − j ≤ k, i.e. fewer than k incorrect samples: pass@k = 1.
  return 1.0 - np.prod(np.clip(factors, 0.0, 1.0), axis=-1)


def standard_error(values) -> float:
  """Standard error of the mean over problems: std(values, ddof=1) / √P, NaNs dropped.

  The spread is across problems, so it counts both the problems' different difficulty and
  each problem's sampling noise: the error bar of the mean as an estimate of the same metric
  on a fresh draw of problems from the task. NaN for fewer than two problems.
  """
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  if len(values) < 2:
    return float("nan")
  return float(values.std(ddof=1) / np.sqrt(len(values)))


def _nanmean(values) -> float:
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  return float(values.mean()) if len(values) else float("nan")


def _nanmean_rows(x: np.ndarray) -> np.ndarray:
  with warnings.catch_warnings():  # all-NaN rows stay NaN
    warnings.simplefilter("ignore", RuntimeWarning)
    return np.nanmean(x, axis=1)


def outcome_metrics(greedy_correct: np.ndarray, sample_correct: np.ndarray | None = None, *,
                    pass_ks: Sequence[int] = (), greedy_format: np.ndarray | None = None,
                    sample_format: np.ndarray | None = None) -> dict[str, float]:
  """Scalar metrics, with standard errors, of per-problem outcomes (NaN = verifier failure).

  Args:
    greedy_correct: `[P]` 0/1 correctness of each problem's greedy completion.
    sample_correct: `[P, n]` 0/1 correctness of n sampled completions (n may be 0).
    pass_ks: the k of each pass@k, each ≤ n.
    greedy_format: `[P]` format reward of the greedy completions.
    sample_format: `[P, n]` format reward of the sampled completions.

  Returns:
    `accuracy` (greedy) and `accuracy_se`; `format` and `format_se` when `greedy_format` is
    given; with n > 0, `sample_accuracy` (mean@n: the mean over problems of each problem's
    fraction of correct samples, i.e. pass@1 at the sampling temperature) and
    `sample_accuracy_se`; `sample_format` (the same mean of format rewards) when given;
    `pass_at_{k}` and `pass_at_{k}_se` for each k (`pass_at_k` per problem, then the mean).
    A problem's NaN samples are left out of its n and c; a problem with fewer than k scored
    samples is left out of pass@k. Every `_se` is `standard_error` over problems.
  """
  greedy_correct = np.asarray(greedy_correct, np.float64)
  metrics = {"accuracy": _nanmean(greedy_correct), "accuracy_se": standard_error(greedy_correct)}
  if greedy_format is not None:
    metrics["format"] = _nanmean(greedy_format)
    metrics["format_se"] = standard_error(greedy_format)
  if sample_correct is None or np.size(sample_correct) == 0:
    if pass_ks:
      raise ValueError(f"pass@k for k in {list(pass_ks)} needs sampled completions; got none")
    return metrics
  sample_correct = np.asarray(sample_correct, np.float64)
  per_problem = _nanmean_rows(sample_correct)
  metrics["sample_accuracy"] = _nanmean(per_problem)
  metrics["sample_accuracy_se"] = standard_error(per_problem)
  if sample_format is not None:
    metrics["sample_format"] = _nanmean(_nanmean_rows(
      np.asarray(sample_format, np.float64).reshape(sample_correct.shape)))
  scored = np.isfinite(sample_correct)
  n = scored.sum(axis=1)
  c = np.where(scored, sample_correct > 0.5, False).sum(axis=1)
  for k in pass_ks:
    if k > sample_correct.shape[1]:
      raise ValueError(f"pass@{k} needs k <= n: k={k}, n={sample_correct.shape[1]} samples "
                       "per problem")
    keep = n >= k
    values = np.full(len(n), np.nan)
    values[keep] = pass_at_k(n[keep], c[keep], k)
    metrics[f"pass_at_{k}"] = _nanmean(values)
    metrics[f"pass_at_{k}_se"] = standard_error(values)
  return metrics


class Evaluation(NamedTuple):
  """Held-out results: scalar `metrics` and the per-prompt outcomes behind them.

  `greedy_correct` is `[prompts]`; `sample_correct` is `[prompts, n]` (empty when n = 0).
  NaN marks a verifier failure. Per-prompt outcomes let two evaluations of the same prompts
  be compared pairwise (`paired_gain`). `greedy_texts` holds the greedy completions
  (`[prompts]` strings), for reports.
  """

  metrics: dict[str, float]
  greedy_correct: np.ndarray
  sample_correct: np.ndarray
  greedy_texts: tuple[str, ...] = ()


def generate_in_chunks(sampler: Sampler, state, prompts: Sequence[str], *,
                       n_samples_per_prompt: int = 1, rows_per_call: int | None = None,
                       rng: jax.Array | None = None, **sampling: Any) -> list[str]:
  """Decoded completions of `prompts` (`n_samples_per_prompt` each, prompt-major), generated
  at most `rows_per_call` completions per sampler call.

  One call for everything when `rows_per_call` is None or large enough (same samples as a
  plain `generate`). Otherwise prompts go `max(1, rows_per_call // n)` at a time, the last
  call padded with repeats of its last prompt so that every call has one shape (one
  compiled program), and call `i` samples with `fold_in(rng, i)`.
  """
  n = n_samples_per_prompt
  per_call = len(prompts) if rows_per_call is None else max(1, rows_per_call // n)
  if per_call >= len(prompts):
    out = sampler.generate(state, list(prompts), n_samples_per_prompt=n, rng=rng, **sampling)
    return list(sampler.decode_text(out))
  texts = []
  for i, start in enumerate(range(0, len(prompts), per_call)):
    chunk = list(prompts[start:start + per_call])
    real = len(chunk)
    chunk += [chunk[-1]] * (per_call - real)
    key = None if rng is None else jax.random.fold_in(rng, i)
    out = sampler.generate(state, chunk, n_samples_per_prompt=n, rng=key, **sampling)
    texts += list(sampler.decode_text(out))[:real * n]
  return texts


def evaluate(sampler: Sampler, state, task: Task, records: Sequence[Mapping[str, Any]], *,
             max_new_tokens: int, k: int = 4, temperature: float = 1.0,
             rng: jax.Array | None = None, timeout_s: float | None = None,
             pass_ks: Sequence[int] | None = None,
             rows_per_call: int | None = None) -> Evaluation:
  """Held-out greedy accuracy and format rate; mean@n and unbiased pass@k at `temperature`.

  The in-run evaluation (`methods.grpo.TaskEvaluator`) and the offline one
  (experiments/evaluate.py) both call this, so a checkpoint scores the same in both.

  Args:
    sampler, state: the policy (`state` in the sampler's layout).
    task, records: the verifier and the problems (`record["prompt"]`).
    max_new_tokens: the generation budget of every completion.
    k: n, the sampled completions per problem (0: greedy only). The name is kept from when
      this was also the only k of pass@k.
    temperature: of the sampled completions.
    rng: of the sampled completions (default `jax.random.key(0)`).
    timeout_s: per verifier call; a call past it scores NaN.
    pass_ks: the k of each pass@k, each ≤ n (default `(n,)`, i.e. "any of the n correct").
    rows_per_call: at most this many completions per sampler call (`generate_in_chunks`;
      default: every prompt in one call), so that the KV cache of a large evaluation fits.
      The sampled completions depend on it (each call has its own key).

  Returns:
    An `Evaluation`; its metrics are `outcome_metrics`' plus `verifier_errors` and
    `verifier_timeouts` (greedy and sampled calls together) and `num_problems`.
  """
  n = int(k)
  pass_ks = ((n,) if n else ()) if pass_ks is None else tuple(int(x) for x in pass_ks)
  if pass_ks and max(pass_ks) > n:
    raise ValueError(f"pass@k needs k <= n: pass_ks={list(pass_ks)} but n={n} samples per "
                     "problem")
  prompts = [r["prompt"] for r in records]
  texts = tuple(generate_in_chunks(sampler, state, prompts, rows_per_call=rows_per_call,
                                   max_new_tokens=max_new_tokens, greedy=True))
  correct, fmt, failures = rewards_for(task, records, texts, 1, timeout_s=timeout_s)
  errors, timeouts = failures.errors, failures.timeouts
  correct_k = np.zeros((len(records), 0), np.float32)
  fmt_k = None
  if n:
    rng = jax.random.key(0) if rng is None else rng
    sampled = generate_in_chunks(sampler, state, prompts, n_samples_per_prompt=n,
                                 rows_per_call=rows_per_call, max_new_tokens=max_new_tokens,
                                 temperature=temperature, rng=rng)
    correct_k, fmt_k, failures = rewards_for(task, records, sampled, n, timeout_s=timeout_s)
    correct_k = correct_k.reshape(-1, n)
    errors, timeouts = errors + failures.errors, timeouts + failures.timeouts
  metrics = outcome_metrics(correct, correct_k, pass_ks=pass_ks, greedy_format=fmt,
                            sample_format=fmt_k)
  metrics.update(verifier_errors=float(errors), verifier_timeouts=float(timeouts),
                 num_problems=float(len(records)))
  return Evaluation(metrics, np.asarray(correct, np.float32), np.asarray(correct_k, np.float32),
                    texts)


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
