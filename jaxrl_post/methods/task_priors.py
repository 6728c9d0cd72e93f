"""Which pool tasks a GRPO-family step trains on: task-sampling priors as parts of a method.

`config.task_prior.name` picks one (default "uniform": the shuffled pass of
`grpo.task_loader`, nothing here):

  "trajval"      TrajVal (arXiv 2608.09217): a static learnability prior. At the run's first
                 step, every task of the pool is scored twice with `samples` sampled
                 completions: r_e under the starting policy, r_l under a short probe run's
                 policy (`config.task_prior.probe`, the workdir or checkpoint directory of a
                 GRPO run on a small uniform subset of the pool); `tasks.trajval_weights`
                 turns the pair into the prior. The endpoint rates and the prior are
                 checkpointed, so a resumed run does not score the pool again.
  "rapo_bucket"  RAPO's R-Bucket (arXiv 2608.03660): a dynamic risk prior. The method reports
                 each drawn task's risk ρ (`observe`); every `refresh_every` steps the pool is
                 cut into risk buckets (`tasks.bucket_probs`). Tasks not drawn yet take the
                 median risk of those that were (PROPOSAL: the paper re-scores the whole
                 stage pool, which costs a rollout per pool task per refresh).

Both draw each step's prompts with `tasks.data.WeightedLoader` (without replacement within a
step) over the first `config.num_train_examples` train examples (the pool).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_post.tasks import data as task_data
from jaxrl_post.tasks import priors
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.evaluation import sample_pass_rates

PRIOR_NAMES = ("uniform", "trajval", "rapo_bucket")


def prior_probs_metrics(probs: np.ndarray) -> dict[str, float]:
  """How peaked a prior is: its entropy relative to uniform's, and its largest mass × N."""
  p = np.asarray(probs, np.float64)
  nz = p[p > 0]
  return {"prior/relative_entropy": float(-(nz * np.log(nz)).sum() / np.log(len(p))),
          "prior/max_over_uniform": float(p.max() * len(p))}


def probe_params(path: str, like):
  """The parameters of the latest checkpoint under `path` (a workdir or its checkpoints/)."""
  root = Path(path)
  for directory in (root / "checkpoints", root):
    if directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir()):
      return Checkpointer(directory).restore_params(None, like)
  raise FileNotFoundError(f"config.task_prior.probe={path!r}: no orbax checkpoint there (the "
                          "probe is a GRPO run on a subset of the pool; give its workdir)")


class TrajValPrior:
  """TrajVal's endpoint-pair prior; see the module docstring."""

  name = "trajval"

  def __init__(self, config, task):
    knobs = config.task_prior
    if not knobs.get("probe"):
      raise ValueError("config.task_prior.probe must name the probe run's workdir for "
                       "task_prior 'trajval'")
    self.config, self.task, self.knobs = config, task, knobs
    self.pool = task_data.TaskSource(task, "train", config.num_train_examples)
    self.loader = task_data.WeightedLoader(self.pool, global_batch_size=config.prompts_per_step,
                                           seed=config.seed)
    n = len(self.pool)
    self.r_early = np.full(n, np.nan, np.float32)
    self.r_late = np.full(n, np.nan, np.float32)
    self.ready = False

  def begin_step(self, method, state, step: int) -> dict[str, float]:
    """At the run's first step: scores the pool under the starting and probe policies."""
    del step
    if self.ready:
      return {}
    tic = time.perf_counter()
    records = [self.pool[i] for i in range(len(self.pool))]

    def rates(params, seed):
      return sample_pass_rates(
        method.sampler, method.evaluator.sampler_params(params)[0], self.task, records,
        samples=self.knobs.samples, max_new_tokens=self.config.max_new_tokens,
        temperature=self.config.temperature, rng=jax.random.key(seed),
        prompts_per_call=self.knobs.prompts_per_call, timeout_s=self.config.reward_timeout_s)

    self.r_early = rates(state.params, self.config.seed + 7)
    self.r_late = rates(probe_params(self.knobs.probe, state.params), self.config.seed + 8)
    self.ready = True
    self._set_probs()
    metrics = {"prior/r_early": float(np.nanmean(self.r_early)),
               "prior/r_late": float(np.nanmean(self.r_late)),
               "prior/learnable_fraction": float(np.mean(self._scores() > 0)),
               "time/prior": time.perf_counter() - tic}
    return metrics | prior_probs_metrics(self.loader.probs)

  def _scores(self) -> np.ndarray:
    return np.asarray(priors.trajval_scores(np.nan_to_num(self.r_early),
                                            np.nan_to_num(self.r_late)))

  def _set_probs(self) -> None:
    # A task whose every verifier call failed counts as unsolved at both ends (v = 0).
    self.loader.set_probs(np.asarray(priors.trajval_weights(
      np.nan_to_num(self.r_early), np.nan_to_num(self.r_late), gamma=self.knobs.gamma,
      floor=self.knobs.floor), np.float64))

  def array_state(self) -> dict[str, Any]:
    return {"r_early": self.r_early, "r_late": self.r_late, "ready": np.bool_(self.ready)}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.r_early, self.r_late = np.asarray(arrays["r_early"]), np.asarray(arrays["r_late"])
    self.ready = bool(arrays["ready"])
    if self.ready:
      self._set_probs()


class RiskBucketPrior:
  """RAPO's R-Bucket prior over the pool, refreshed from the risks the method observes."""

  name = "rapo_bucket"

  def __init__(self, config, task):
    self.config, self.knobs = config, config.task_prior
    if self.knobs.refresh_every < 1:
      raise ValueError(f"config.task_prior.refresh_every must be >= 1, got "
                       f"{self.knobs.refresh_every}")
    self.pool = task_data.TaskSource(task, "train", config.num_train_examples)
    self.loader = task_data.WeightedLoader(self.pool, global_batch_size=config.prompts_per_step,
                                           seed=config.seed)
    self.risk = np.full(len(self.pool), np.nan, np.float32)  # NaN: never drawn

  def begin_step(self, method, state, step: int) -> dict[str, float]:
    del method, state
    if step == 1 or (step - 1) % self.knobs.refresh_every:
      return {}
    seen = np.isfinite(self.risk)
    if not seen.any():
      return {}
    filled = np.where(seen, self.risk, np.median(self.risk[seen]))
    self.loader.set_probs(np.asarray(priors.bucket_probs(
      filled, probs=tuple(self.knobs.bucket_probs), uniform_mix=self.knobs.uniform_mix),
      np.float64))
    return {"prior/seen_fraction": float(seen.mean())} | prior_probs_metrics(self.loader.probs)

  def observe(self, indices: np.ndarray, values: np.ndarray) -> None:
    """Records the risk ρ `values[i]` of pool task `indices[i]` (its latest draw wins)."""
    self.risk[np.asarray(indices, np.int64)] = np.asarray(values, np.float32)

  def array_state(self) -> dict[str, Any]:
    return {"risk": self.risk, "probs": self.loader.probs}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.risk = np.asarray(arrays["risk"], np.float32)
    self.loader.set_probs(np.asarray(arrays["probs"], np.float64), normalise=False)


def build_task_prior(config, task):
  """The configured prior (`config.task_prior.name`), or None for the uniform shuffled pass."""
  knobs = config.get("task_prior")
  name = "uniform" if knobs is None else knobs.name
  if name not in PRIOR_NAMES:
    raise ValueError(f"config.task_prior.name={name!r}; valid: {', '.join(PRIOR_NAMES)}")
  if name == "trajval":
    return TrajValPrior(config, task)
  if name == "rapo_bucket":
    return RiskBucketPrior(config, task)
  return None
