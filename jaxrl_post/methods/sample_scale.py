"""Per-prompt loss scaling in a GRPO-family step: RAPO's R-Scale (arXiv 2608.03660).

`config.sample_scale.name` picks it (default "none"). RAPO scales each prompt's policy loss by
λ_x = clip(1 − ρ_x, λ_min, 1) (no gradient through λ), where the risk

  ρ_x = σ(κ · (z(sens_x) − z(rel_x)))

is high for prompts whose rollouts disagree (low reliability rel_x = 1 − 4 p̂(1 − p̂)) and whose
tokens are sensitive (sens_x = mean over the group's completion tokens of π(y)(1 − π(y)), from
the old-policy log-probs the step already has), z being z-scores over the step's prompts. All
formulas are PROPOSAL choices (`losses.rapo`). Scaling the loss of every row of a prompt by λ_x
is scaling its advantages by λ_x: the PPO surrogate is linear in the advantage (the KL term,
when there is one, is left unscaled). The risks also feed RAPO's R-Bucket prior
(`methods.task_priors`) through the method.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrl_post.losses import rapo

SCALE_NAMES = ("none", "rapo")


class RiskScale:
  """RAPO's R-Scale over a step's record-major groups; see the module docstring."""

  def __init__(self, config):
    knobs = config.sample_scale
    if knobs.sensitivity != "sampled":
      raise ValueError(f"config.sample_scale.sensitivity={knobs.sensitivity!r}; the step has "
                       "only the sampled tokens' log-probs, so 'sampled' is the one available")
    if not 0.0 <= knobs.lam_min <= 1.0:
      raise ValueError(f"config.sample_scale.lam_min must be in [0, 1], got {knobs.lam_min}")
    self.knobs, self.group_size = knobs, config.group_size

  def __call__(self, correct: np.ndarray, old_logp: np.ndarray, mask: np.ndarray):
    """`(λ [groups], ρ [groups], metrics)` from the rows' rewards `[rows]` (NaN = missing) and
    their old-policy token log-probs / mask `[rows, T]`, rows record-major."""
    g = self.group_size
    rewards = np.asarray(correct, np.float32).reshape(-1, g)
    valid = np.isfinite(rewards)
    rel = rapo.rapo_reliability(jnp.asarray(np.nan_to_num(rewards)), jnp.asarray(valid),
                                binary=self.knobs.binary)
    groups = rewards.shape[0]
    # Token mean over the whole group: every completion token of the prompt's rollouts.
    logp = np.asarray(old_logp, np.float32).reshape(groups, -1)
    token_mask = np.asarray(mask, bool).reshape(groups, -1)
    sens = rapo.sampled_token_sensitivity(jnp.asarray(logp), jnp.asarray(token_mask))
    rho = rapo.rapo_risk(rel, sens, jnp.asarray(valid.any(axis=1)), kappa=self.knobs.kappa,
                         normalise=self.knobs.normalise)
    lam = np.asarray(rapo.rapo_scale(rho, lam_min=self.knobs.lam_min))
    rho = np.asarray(rho)
    metrics = {"train/rapo_lambda_mean": float(lam.mean()),
               "train/rapo_lambda_min": float(lam.min()),
               "train/rapo_reliability": float(np.mean(rel)),
               "train/rapo_sensitivity": float(np.mean(sens))}
    return lam, rho, metrics

  def transform(self, method, state, batch, ctx):
    """The `step_parts` hook: every row's advantage × its prompt's λ; the risks go to a task
    prior that observes them (RAPO's R-Bucket)."""
    del state
    lam, rho, metrics = self(ctx.verified.correct, batch["old_logp"], batch["completion_mask"])
    adv = np.asarray(batch["adv"])
    rows_lam = np.repeat(lam, self.group_size).reshape((-1,) + (1,) * (adv.ndim - 1))
    prior = method.parts.get("task_prior")
    if hasattr(prior, "observe"):
      prior.observe(np.asarray([r["index"] for r in ctx.records]), rho)
    return dict(batch, adv=adv * rows_lam), metrics


def build_sample_scale(config):
  """The configured scale (`config.sample_scale.name`), or None ("none")."""
  knobs = config.get("sample_scale")
  name = "none" if knobs is None else knobs.name
  if name not in SCALE_NAMES:
    raise ValueError(f"config.sample_scale.name={name!r}; valid: {', '.join(SCALE_NAMES)}")
  return RiskScale(config) if name == "rapo" else None
