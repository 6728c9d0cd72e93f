"""RecoverFly (arXiv 2608.09467): failure-aware token-level RL for grammar-constrained action
programs, on the one loop (configs/recoverfly.py, experiments/recoverfly.py).

GRPO (`methods.grpo.GRPO`) with RecoverFly's four components (each is a PROPOSAL,
the paper's rules are "not found"):

  1. token-level RL on grammar-constrained action tokens: `config.constrained_decoding` masks
     every decode step to the task's grammar (`tasks.aerial_nav`: `M<dir><dist> … STOP`) and
     every log-prob is the masked, renormalised one; the clipped surrogate is token-mean over
     the completion, where forced tokens (one legal id) have log-prob 0 and no gradient, so
     only the action-choice tokens (dir, dist) are trained;
  2. failure revisiting (`config.recoverfly.rho_fail`, `tau`, `evict_after`, `age_weight`,
     `capacity`; `methods.failure_replay`);
  3. the two-stage long-tail scene curriculum (`config.recoverfly.switch_step`, `alpha`; same);
  4. the reference KL to the frozen starting policy on a window of action tokens
     (`config.loss.beta`, `config.recoverfly.kl_window`: 0 = whole trajectory, w = the last w
     action-choice tokens; k3; `losses.window_kl`, policy loss "recoverfly_window_kl").

Each component switches off on its own (ρ_fail = 0, switch_step beyond the run, β = 0), which
is how scripts/recoverfly_ablation.py runs GRPO, +replay, +curriculum, +KL and all.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl_post.losses import window_kl
from jaxrl_post.methods.failure_replay import FailureReplay
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.tasks import aerial_nav as aerial_nav  # registers "aerial_nav"
from jaxrl_post.training import loop

WINDOW_LOSS = "recoverfly_window_kl"


class WindowKL:
  """The `transform` part that marks the KL window in the batch's `ref_logp` (NaN outside;
  `losses.window_kl.mark_window`)."""

  def __init__(self, config):
    self.window = int(config.recoverfly.kl_window)
    if self.window < 0:
      raise ValueError(f"config.recoverfly.kl_window={self.window} must be >= 0 (0: whole "
                       "trajectory)")

  def transform(self, method, state, batch, ctx):
    del state, ctx
    if "ref_logp" not in batch:
      return batch, {}
    mask = np.asarray(batch["completion_mask"], bool)
    choice = mask
    grammar = getattr(method, "grammar", None)
    if grammar is not None and "grammar_state" in batch:
      legal = np.asarray(grammar.allowed).sum(-1)  # [S] legal ids per state
      choice = mask & (legal[np.asarray(batch["grammar_state"])] > 1)
    win = window_kl.action_window(choice, self.window)
    batch = dict(batch, ref_logp=window_kl.mark_window(batch["ref_logp"], win))
    return batch, {"recoverfly/kl_window_tokens": float(win.sum()),
                   "recoverfly/action_tokens": float(choice.sum())}


class RecoverFly(GRPO):
  """GRPO + failure replay + long-tail curriculum + windowed reference KL; a
  `training.loop.Method` (module docstring)."""

  name = "recoverfly"

  def __init__(self, config):
    if config.loss.name != WINDOW_LOSS:
      raise ValueError(f"config.loss.name={config.loss.name!r}: RecoverFly's loss is "
                       f"{WINDOW_LOSS!r} (the windowed KL)")
    if config.get("rollout") and config.rollout.get("mode", "sync") not in ("sync",):
      raise ValueError(f"config.rollout.mode={config.rollout.mode!r}: the failure buffer needs "
                       "synchronous rollouts")
    super().__init__(config)

  def build_model(self, run: loop.Run):
    model = super().build_model(run)
    if any(hasattr(part, "loader") for part in self.parts.values()):
      raise ValueError("config.task_prior: RecoverFly draws its own batches (failure replay + "
                       "curriculum); set config.task_prior.name='uniform'")
    self.parts = {"recoverfly": FailureReplay(self.config, self.task), **self.parts,
                  "window_kl": WindowKL(self.config)}
    return model

  def progress(self, record) -> dict[str, Any]:
    return super().progress(record) | {"buf": record.get("failure/buffer_size", 0.0)}
