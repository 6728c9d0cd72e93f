"""Glue between tasks, the sampler and the losses: batches, SFT / GRPO losses, evaluation.

Everything here is a plain function the experiment binaries call; the maths
lives in `jaxrl_post.losses` and `jaxrl_post.advantages`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses
from jaxrl_post.sampling import Sampler, score_model
from jaxrl_post.tasks.base import Task

# PolicyLossAux fields that add up over micro-batches (they are normalised by
# the global token count); min / max fields do not and are left out.
_ADDITIVE_AUX = ("pg_loss", "kl_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high",
                 "clip_frac_dual", "ratio_mean", "sampler_weight_mean")


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str], *,
                 prompt_len: int, completion_len: int,
                 add_eos: bool = True) -> dict[str, np.ndarray]:
  """Tokenizes (prompt, completion) pairs: prompts left-padded, completions right-padded.

  Completions longer than `completion_len` (EOS included) are cut; prompts
  longer than `prompt_len` raise, naming the prompt.
  """
  prompt_tokens, prompt_mask = tokenizer.encode_batch(list(prompts), max_len=prompt_len)
  rows = len(completions)
  completion_tokens = np.full((rows, completion_len), tokenizer.pad_id, np.int32)
  completion_mask = np.zeros((rows, completion_len), bool)
  for i, text in enumerate(completions):
    ids = tokenizer.encode(text) + ([tokenizer.eos_id] if add_eos else [])
    ids = ids[:completion_len]
    completion_tokens[i, :len(ids)] = ids
    completion_mask[i, :len(ids)] = True
  return dict(prompt_tokens=np.asarray(prompt_tokens, np.int32),
              prompt_mask=np.asarray(prompt_mask, bool), completion_tokens=completion_tokens,
              completion_mask=completion_mask)


def with_normalizers(batch: Mapping[str, Any]) -> dict[str, Any]:
  """Adds the whole batch's `num_tokens` / `num_sequences` (shared by micro-batches)."""
  norm = losses.loss_normalizers(jnp.asarray(batch["completion_mask"]))
  return dict(batch, num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)


def sft_loss(model, batch):
  """Teacher-forced negative log-likelihood of the completion tokens, per token.

  Normalised by the whole batch's `num_tokens`, so micro-batches add up.
  """
  scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                       batch["completion_tokens"], batch["completion_mask"])
  nll = -jnp.sum(scored.logp) / batch["num_tokens"]
  return nll, {"nll": nll}


def make_policy_loss(*, policy_loss: str = "grpo", temperature: float = 1.0, **loss_kwargs):
  """`(model, batch) -> (loss, aux)` for a policy-gradient update.

  The batch holds a rollout (`prompt_*`, `completion_*`), `old_logp` (the
  policy that sampled, recomputed by `score`), `adv` `[batch]`, optional
  `ref_logp`, and the global `num_tokens` / `num_sequences`.
  `loss_kwargs` go to the registered policy loss (`jaxrl_post.losses`).
  """
  loss_fn = losses.POLICY_LOSSES.get(policy_loss)

  def loss(model, batch):
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                         batch["completion_tokens"], batch["completion_mask"],
                         temperature=temperature)
    value, aux = loss_fn(
      scored.logp, batch["old_logp"], batch["adv"], batch["completion_mask"],
      ref_logp=batch.get("ref_logp"), entropy=jax.lax.stop_gradient(scored.entropy),
      num_tokens=batch["num_tokens"], num_sequences=batch["num_sequences"], **loss_kwargs)
    metrics = {k: getattr(aux, k) for k in _ADDITIVE_AUX if getattr(aux, k, None) is not None}
    return value, metrics

  return loss


class VerifierTimeout(Exception):
  """A verifier ran past its time limit on one sample."""


@contextlib.contextmanager
def _time_limit(seconds: float | None):
  """Raises `VerifierTimeout` in the body after `seconds` of wall clock.

  Uses SIGALRM (a real interrupt, so a verifier stuck in a Python loop or a
  sleep is stopped); off the main thread, or on platforms without it, the
  body runs without a limit.
  """
  usable = (seconds and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread())
  if not usable:
    yield
    return

  def on_alarm(signum, frame):
    raise VerifierTimeout(f"verifier exceeded {seconds} s")

  previous = signal.signal(signal.SIGALRM, on_alarm)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


class RewardFailures(NamedTuple):
  """How many samples got no reward, by cause."""

  errors: int = 0
  timeouts: int = 0

  @property
  def total(self) -> int:
    return self.errors + self.timeouts


def rewards_for(task: Task, records: Sequence[Mapping[str, Any]], texts: Sequence[str],
                group_size: int, *, timeout_s: float | None = None,
                ) -> tuple[np.ndarray, np.ndarray, RewardFailures]:
  """Scores `texts` (group_size per record) with the task's verifier.

  A verifier that raises, or runs past `timeout_s` seconds on a sample, gives
  NaN (a missing reward, which the advantages ignore) instead of stopping the
  run; the failures are counted by cause.
  """
  correct = np.zeros(len(texts), np.float32)
  fmt = np.zeros(len(texts), np.float32)
  errors = timeouts = 0
  for i, text in enumerate(texts):
    try:
      with _time_limit(timeout_s):
        correct[i], fmt[i] = task.reward(records[i // group_size], text)
    except VerifierTimeout:
      correct[i] = fmt[i] = np.nan
      timeouts += 1
    except Exception:  # noqa: BLE001 - any verifier bug must not kill training
      correct[i] = fmt[i] = np.nan
      errors += 1
  return correct, fmt, RewardFailures(errors, timeouts)


def trim_completions(batch: Mapping[str, Any], multiple: int) -> dict[str, Any]:
  """Drops the all-padding tail of the completion arrays, keeping a multiple of `multiple`.

  A sampler pads completions to `max_new_tokens`; the update and the scoring
  passes cost the padded width, so cutting it to the longest completion of the
  step (rounded up, so only a few widths ever compile) saves their work.
  `multiple=0` keeps the batch as it is.
  """
  mask = np.asarray(batch["completion_mask"])
  width = mask.shape[1]
  if not multiple:
    return dict(batch)
  longest = int(mask.any(axis=0).nonzero()[0].max(initial=-1)) + 1
  keep = min(width, max(multiple, -(-longest // multiple) * multiple))
  return {k: (v[:, :keep] if k.startswith("completion_") else v) for k, v in batch.items()}


def ppo_mini_batches(batch: Mapping[str, Any], num_mini_batches: int,
                     rng: np.random.Generator) -> list[dict[str, Any]]:
  """Splits a rollout batch into `num_mini_batches` shuffled row subsets, one optimizer step each.

  Every array in `batch` has the rollout rows on axis 0. Each mini-batch gets
  its own `num_tokens` / `num_sequences` (it is a separate update), so a
  token-mean loss averages over that mini-batch's tokens, as in PPO.
  """
  rows = len(batch["completion_mask"])
  if num_mini_batches < 1 or rows % num_mini_batches:
    raise ValueError(f"config.ppo_mini_batches={num_mini_batches} must divide the "
                     f"{rows} rollouts of a step")
  order = rng.permutation(rows)
  size = rows // num_mini_batches
  chunks = [np.sort(order[i * size:(i + 1) * size]) for i in range(num_mini_batches)]
  return [with_normalizers({k: v[idx] for k, v in batch.items()}) for idx in chunks]


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


def mean_update_metrics(updates: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """Metrics of one RL step's several optimizer updates: the mean, except running counters.

  `nonfinite_streak` is a counter carried in the train state, so the last
  update's value is the current one; `skipped` adds up.
  """
  merged = {k: float(np.mean([u[k] for u in updates])) for k in updates[0]}
  merged["nonfinite_streak"] = updates[-1]["nonfinite_streak"]
  merged["skipped"] = float(sum(u["skipped"] for u in updates))
  merged["num_updates"] = float(len(updates))
  return merged
