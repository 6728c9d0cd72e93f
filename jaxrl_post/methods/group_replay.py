"""Group replay in a GRPO-family step: Headroom-Drift Replay (arXiv 2609.03941) and its baselines.

`config.replay.name` picks the selection rule from `replay.REPLAY_SELECTORS` (default "none"):
"headroom_drift" (the paper), "headroom_only" (no drift gate) or "naive" (the newest groups).
Per step, with the fresh groups already sampled, verified and scored (`GroupReplay.select`
before the update, `GroupReplay.add` after it):

  B. the buffer's first `max_candidates` groups by cached headroom are scored teacher-forced
     by the current policy (one fixed-shape pass on the trainer's mesh);
  C. their drift (L2 mean of log π_θ − log π_gen) and refreshed headroom give the selection:
     up to `budget` groups with drift ≤ τ, walking by headroom; the refreshed headroom is
     written back;
  D. the accepted groups join the actor batch with their stored advantages, their stored
     generation log-probs as `old_logp` (the PPO ratio is taken against π_gen, PROPOSAL), and
     the fresh data untouched. The batch always has `budget` replay groups' rows, so its shape
     never changes: a slot with nothing accepted is masked out (no tokens, no advantage);
  E. after the update, the fresh groups with mixed outcomes (`replay.ingress_mask` on the
     verifier's correctness) are appended FIFO, evicting the oldest beyond `capacity` — after
     selection, so a group is never replayed in the step that made it.

The buffer is the method's checkpointed array state (`array_state`), so a resumed run replays
exactly what the uninterrupted one would. Reference log-probs of replayed groups are not scored:
replay needs `config.loss.beta = 0` (the paper's GRPO has no KL term).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxrl_post import replay as replay_lib
from jaxrl_post.parallel import multihost

REPLAY_NAMES = ("none", *replay_lib.REPLAY_SELECTORS.names())
# The rollout arrays of the actor batch that have a time axis.
TIME_KEYS = ("completion_tokens", "completion_mask", "old_logp")


def _fit_width(x: np.ndarray, width: int, fill) -> np.ndarray:
  """`x [rows, T, ...]` cut or padded with `fill` to `width` along axis 1."""
  if x.shape[1] >= width:
    return x[:, :width]
  pad = [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
  return np.pad(x, pad, constant_values=fill)


def concat_rows(fresh: Mapping[str, Any], extra: Mapping[str, Any], *, multiple: int
                ) -> dict[str, Any]:
  """Stacks two actor batches row-wise at one completion width: the longest real completion
  of either, rounded up to `multiple` (0: the wider of the two). Token-level `adv` is padded
  like the log-probs; `[rows]` keys are stacked as they are."""
  wider = max(np.shape(fresh["completion_mask"])[1], np.shape(extra["completion_mask"])[1])
  mask = np.concatenate([_fit_width(np.asarray(batch["completion_mask"]), wider, False)
                         for batch in (fresh, extra)])
  longest = int(mask.any(axis=0).nonzero()[0].max(initial=-1)) + 1
  width = (max(multiple, -(-longest // multiple) * multiple) if multiple else mask.shape[1])
  width = min(width, mask.shape[1])
  out = {}
  for key in fresh:
    a, b = np.asarray(fresh[key]), np.asarray(extra[key])
    if key in TIME_KEYS or (key == "adv" and a.ndim == 2):
      fill = False if a.dtype == bool else 0
      a, b = _fit_width(a, width, fill), _fit_width(b, width, fill)
    out[key] = np.concatenate([a, b])
  return out


class GroupReplay:
  """Headroom-Drift Replay (or a baseline rule) for a GRPO-family method."""

  def __init__(self, config):
    knobs = config.replay
    if knobs.name not in REPLAY_NAMES:
      raise ValueError(f"config.replay.name={knobs.name!r}; valid: {', '.join(REPLAY_NAMES)}")
    if config.loss.beta > 0:
      raise ValueError("config.replay needs config.loss.beta = 0: replayed groups have no "
                       "reference log-probs")
    for key in ("capacity", "budget", "max_candidates"):
      if knobs[key] < 1:
        raise ValueError(f"config.replay.{key} must be >= 1, got {knobs[key]}")
    if knobs.max_candidates < knobs.budget:
      raise ValueError(f"config.replay.max_candidates ({knobs.max_candidates}) must be >= "
                       f"config.replay.budget ({knobs.budget})")
    rows = (config.prompts_per_step + knobs.budget) * config.group_size
    if rows % (config.ppo_mini_batches * config.num_micro_batches):
      raise ValueError(f"config.ppo_mini_batches × config.num_micro_batches must divide the "
                       f"{rows} rows of a step with replay ((prompts_per_step + "
                       f"config.replay.budget) × group_size)")
    self.knobs, self.config = knobs, config
    self.select_fn = replay_lib.REPLAY_SELECTORS.get(knobs.name)
    self.buffer = replay_lib.replay_init(
      capacity=knobs.capacity, group_size=config.group_size, length=config.max_new_tokens,
      prompt_length=config.prompt_len)

  # ---- D: the replayed rows of this step's actor batch ----

  def select(self, scorer, params, put) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Scores the candidates, selects, refreshes their headroom; returns `budget × G` rows."""
    tic = time.perf_counter()
    knobs, buffer = self.knobs, self.buffer
    g = self.config.group_size
    cand = replay_lib.candidate_order(buffer.headroom, buffer.valid,
                                      max_candidates=knobs.max_candidates)
    groups = replay_lib.replay_gather(buffer, cand.indices)
    m, _, t = groups.tokens.shape
    rows = {"prompt_tokens": np.repeat(np.asarray(groups.prompt_tokens), g, axis=0),
            "prompt_mask": np.repeat(np.asarray(groups.prompt_mask), g, axis=0),
            "completion_tokens": np.asarray(groups.tokens).reshape(m * g, t),
            "completion_mask": np.asarray(groups.mask & cand.accepted[:, None, None]
                                          ).reshape(m * g, t)}
    logp = scorer.score(params, **put(rows), temperature=self.config.temperature,
                        num_micro_batches=self.config.score_micro_batches).logp
    logp_cur = jnp.asarray(multihost.to_host(logp)).reshape(m, g, t)
    mask = groups.mask & cand.accepted[:, None, None]
    drift = replay_lib.group_drift(logp_cur, groups.logp_gen, mask)
    headroom = replay_lib.group_headroom(logp_cur, groups.adv, mask)
    self.buffer = replay_lib.refresh_headroom(buffer, cand.indices, headroom,
                                              where=cand.accepted)
    age = replay_lib.buffer_age(buffer)[cand.indices]
    chosen = self.select_fn(headroom, drift, cand.accepted, budget=knobs.budget,
                            tau=knobs.tau, age=age)
    picked = replay_lib.replay_gather(self.buffer, cand.indices[chosen.indices])
    keep = np.asarray(chosen.accepted)
    k = knobs.budget
    batch = {"prompt_tokens": np.repeat(np.asarray(picked.prompt_tokens), g, axis=0),
             "prompt_mask": np.repeat(np.asarray(picked.prompt_mask), g, axis=0),
             "completion_tokens": np.asarray(picked.tokens).reshape(k * g, t),
             "completion_mask": (np.asarray(picked.mask) & keep[:, None, None]
                                 ).reshape(k * g, t),
             "old_logp": np.asarray(picked.logp_gen).reshape(k * g, t),
             "adv": (np.asarray(picked.adv) * keep[:, None]).reshape(k * g)}
    accepted_drift = np.asarray(drift)[np.asarray(chosen.indices)][keep]
    metrics = {"replay/accepted": float(keep.sum()),
               "replay/candidates": float(np.asarray(cand.accepted).sum()),
               "replay/buffer_groups": float(buffer.count),
               "replay/drift_accepted": float(accepted_drift.mean()) if keep.any() else 0.0,
               "time/replay_select": time.perf_counter() - tic}
    return batch, metrics

  def transform(self, method, state, batch, ctx):
    """The `step_parts` hook: the step's batch plus `budget` replayed groups' rows."""
    replayed, metrics = self.select(method.scorer, state.params, ctx.put)
    return concat_rows(batch, replayed, multiple=self.config.trim_completions_to), metrics

  def after_update(self, method, ctx) -> dict[str, float]:
    """The `step_parts` hook: the step's fresh groups enter the buffer."""
    del method
    return self.add(ctx.fresh, ctx.verified.correct, ctx.step)

  # ---- E: the fresh groups enter the buffer after the update ----

  def add(self, fresh: Mapping[str, Any], correct: np.ndarray, step: int) -> dict[str, float]:
    """Appends the step's fresh groups (record-major rows of `fresh`) with mixed outcomes."""
    g, t = self.config.group_size, self.config.max_new_tokens
    p = len(correct) // g
    admit = replay_lib.ingress_mask(jnp.asarray(np.asarray(correct, np.float32).reshape(p, g)))
    tokens = _fit_width(np.asarray(fresh["completion_tokens"]), t, 0).reshape(p, g, t)
    mask = _fit_width(np.asarray(fresh["completion_mask"]), t, False).reshape(p, g, t)
    logp = _fit_width(np.asarray(fresh["old_logp"]), t, 0.0).reshape(p, g, t)
    prompt_tokens = np.asarray(fresh["prompt_tokens"]).reshape(p, g, -1)[:, 0]
    prompt_mask = np.asarray(fresh["prompt_mask"]).reshape(p, g, -1)[:, 0]
    adv = np.asarray(fresh["adv"]).reshape(p, g)
    self.buffer = replay_lib.replay_add(self.buffer, prompt_tokens, prompt_mask, tokens, mask,
                                        np.where(mask, logp, 0.0), adv, admit, step=step)
    return {"replay/admitted": float(np.asarray(admit).sum())}

  def array_state(self) -> dict[str, Any]:
    return {k: np.asarray(v) for k, v in self.buffer._asdict().items()}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.buffer = replay_lib.ReplayBuffer(**{k: jnp.asarray(arrays[k])
                                             for k in replay_lib.ReplayBuffer._fields})


def build_group_replay(config):
  """The configured replay (`config.replay.name`), or None ("none")."""
  knobs = config.get("replay")
  if knobs is None or knobs.name == "none":
    return None
  return GroupReplay(config)

