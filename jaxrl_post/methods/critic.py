"""PPO with a learned critic as a part of the GRPO-family step: a value model, GAE, value updates.

Classic LLM PPO (InstructGPT, arXiv 2203.02155; PPO, arXiv 1707.06347; GAE, arXiv 1506.02438)
replaces the group baseline of GRPO with a value model V_φ that scores every completion prefix.
Turned on by a `config.critic` section (`enabled=True`); per step, after the old policy is
scored:

  1. `transform`: the critic scores the step's rows (V_old `[rows, time]`,
     `models.value.score_values`); the verifier's outcome (the `config.reward_weights` sum of
     the step's reward columns) is placed on each completion's last token, minus
     β_kl·KL(π_old ‖ π_ref) per token when `kl_in_reward` = β_kl > 0 (k1, InstructGPT's reward
     shaping); GAE(γ, λ) gives advantages and λ-returns (`advantages.gae_advantages`); the
     advantages, whitened over the step's valid tokens (`advantages.whiten`, unless
     `whiten=False`), replace the batch's `adv` (the policy loss takes `[rows, time]`), and
     `returns`, `old_values` and `value_mask` are added to it;
  2. the policy's PPO phase runs as usual on those advantages;
  3. `after_update`: `epochs × config.ppo_mini_batches` critic updates
     (`training.ppo.ppo_phase` with the critic's own `make_train_step`) on PPO's clipped value
     loss (`losses.value_loss`), logged as `critic/value_loss`, `critic/explained_variance`,
     `critic/value_mean`, `critic/clip_frac`, `critic/grad_norm` (and `time/critic_values`,
     `time/critic_update`).

Rows whose every reward is missing (the verifier failed) get advantage 0 and are left out of the
critic's loss (`value_mask`). The critic starts from the policy's *starting* weights (verl's
default: a model that already reads the task) with a zero head, and has its own optimizer
(`config.critic.optimizer`; verl and OpenRLHF train the critic at 5-10× the actor's rate).

How the critic is checkpointed. Its `TrainState` (parameters, Adam moments, step, counters)
is the part's `sharded_state()`: the loop saves it with every checkpoint next to the policy's,
sharded through orbax (each process writes and reads its own shards, nothing gathered on a
host), and a resumed run continues the very same critic (a restart equals an uninterrupted
run). The critic doubles the trainer's model memory (parameters, moments, activations), as in
every PPO-with-critic system.
"""

from __future__ import annotations

import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post import advantages as advantages_lib
from jaxrl_post import losses
from jaxrl_post.models.value import ValueModel, score_values
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.axes import axis_rules
from jaxrl_post.training import ppo
from jaxrl_post.training.setup import build_optimizer
from jaxrl_post.training.train_state import create_train_state, make_train_step

# The rollout columns the critic reads (those of `methods.grpo.ROLLOUT_KEYS`).
INPUT_KEYS = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask")
# What `transform` adds to the actor batch; the critic's updates read these with `INPUT_KEYS`.
CRITIC_KEYS = ("returns", "old_values", "value_mask")


def critic_loss(value_clip: float | None):
  """`(model, batch) -> (loss, aux)` for `make_train_step`: PPO's clipped value loss of a
  `ValueModel` on the batch's `returns` / `old_values` over `value_mask`, normalised by the whole
  mini-batch's `num_tokens` (additive over micro-batches)."""

  def loss(model, batch):
    values = model.completion_values(batch["prompt_tokens"], batch["prompt_mask"],
                                     batch["completion_tokens"], batch["completion_mask"])
    value, aux = losses.value_loss(values, batch["old_values"], batch["returns"],
                                   batch["value_mask"], clip=value_clip,
                                   num_tokens=batch["num_tokens"])
    return value, aux.additive()

  return loss


class Critic:
  """The `critic` step part (module docstring): its own value model, optimizer and updates.

  Raises (at construction):
    ValueError: naming `config.critic.<key>` for γ or λ outside [0, 1], a negative
      `value_clip`, `kl_in_reward` or `epochs` < 1, a missing `optimizer`, a run that also
      replays old groups (`config.replay`), whose rows carry one advantage each, or a LoRA run
      (`config.lora.rank` > 0).
  """

  def __init__(self, config):
    knobs = config.critic
    for key in ("gamma", "lam"):
      value = knobs.get(key)
      if value is None or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"config.critic.{key}={value!r} must be in [0, 1]")
    clip = knobs.get("value_clip", 0.2)
    if clip is not None and float(clip) < 0:
      raise ValueError(f"config.critic.value_clip={clip!r} must be >= 0 (None: no clipping)")
    kl_coef = float(knobs.get("kl_in_reward", 0.0))
    if kl_coef < 0:
      raise ValueError(f"config.critic.kl_in_reward={kl_coef!r} must be >= 0 (the KL penalty "
                       "β_kl subtracted from each token's reward)")
    epochs = int(knobs.get("epochs", 1))
    if epochs < 1:
      raise ValueError(f"config.critic.epochs={epochs} must be >= 1")
    if knobs.get("optimizer") is None:
      raise ValueError("config.critic.optimizer is missing: the critic has an optimizer of its "
                       "own (base_configs.optimizer_config(lr=...))")
    replay = config.get("replay")
    if replay is not None and replay.get("name", "none") != "none":
      raise ValueError(f"config.critic with config.replay.name={replay.name!r}: replayed rows "
                       "carry one advantage each, the critic's per token; use one of them")
    lora = config.get("lora")
    if lora is not None and int(lora.get("rank", 0)) > 0:
      raise ValueError(f"config.critic with config.lora.rank={lora.rank}: the critic starts from "
                       "the full policy weights, which a LoRA run's state does not hold; set "
                       "config.lora.rank=0 (a LoRA critic is not built)")
    self.gamma, self.lam = float(knobs.gamma), float(knobs.lam)
    self.value_clip = None if clip is None else float(clip)
    self.kl_coef, self.epochs = kl_coef, epochs
    self.whiten = bool(knobs.get("whiten", True))
    self.optimizer_config = knobs.optimizer
    self.state = self.pending = self.reference = None

  # ---- start: the critic from the starting policy ----

  def start(self, method, state) -> None:
    """Builds the critic (trunk = a copy of the starting policy, zero head), its optimizer,
    train state (born sharded on the trainer's mesh), update step and scoring pass."""
    run, config = method.run, method.config
    mesh, rules = run.train_mesh, run.train_rules
    model = ValueModel.from_policy(run.graphdef, state.params)
    updates = config.steps * self.epochs * config.ppo_mini_batches
    # `build_optimizer` reads `.optimizer` (and an optional `.update_constraint`, GCPO's, which
    # constrains the policy's updates only).
    optimizer = build_optimizer(types.SimpleNamespace(optimizer=self.optimizer_config), updates)
    self.state = create_train_state(model, optimizer, jax.random.key(config.seed + 2),
                                    mesh=mesh, rules=rules)
    graphdef = self.graphdef = nnx.split(model)[0]
    self.step_fn = make_train_step(graphdef, critic_loss(self.value_clip), optimizer,
                                   num_micro_batches=config.num_micro_batches, mesh=mesh,
                                   rules=rules, shared=("num_tokens", "num_sequences"))
    micro_batches = config.score_micro_batches

    def values(params, inputs):
      with axis_rules(mesh, rules):
        return score_values(graphdef, params, **inputs, num_micro_batches=micro_batches)

    self.values_fn = jax.jit(values)
    if self.kl_coef > 0:
      # The frozen reference of the KL penalty: the method's when its loss has a KL term, else
      # a copy of the starting policy (also after a restart, as `GRPO.start` does).
      self.reference = (method.reference if method.reference is not None
                        else jax.tree.map(jnp.copy, state.params))

  # ---- transform: V_old, token rewards, GAE ----

  def step_rewards(self, method, verified) -> tuple[np.ndarray, np.ndarray]:
    """`(reward [rows], valid [rows])`: the `config.reward_weights` sum of the step's reward
    columns (`advantages.combine_rewards`; missing rewards skipped), 0 where none exists."""
    columns = {"correct": verified.correct, "format": verified.format}
    names = method.objective.reward_names
    matrix = np.stack([np.asarray(columns[k], np.float32) for k in names], axis=1)
    combined = advantages_lib.combine_rewards(jnp.asarray(matrix),
                                              method.objective.reward_weights)
    valid = np.asarray(combined.valid)
    return np.where(valid, np.asarray(combined.reward), 0.0).astype(np.float32), valid

  def transform(self, method, state, batch, ctx):
    """The `step_parts` hook: `adv` ← whitened GAE advantages `[rows, time]`, plus `returns`,
    `old_values` and `value_mask` (see the module docstring)."""
    del state
    config = method.config
    inputs = {k: batch[k] for k in INPUT_KEYS}
    reward, valid = self.step_rewards(method, ctx.verified)
    rows = len(batch["completion_mask"])
    if len(reward) != rows:
      raise ValueError(f"config.critic: the step has {len(reward)} rewarded rows but "
                       f"{rows} rows to train on; a part that adds rows cannot precede it")
    tic = time.perf_counter()
    placed = ctx.put(inputs)
    old_values = np.asarray(multihost.to_host(self.values_fn(self.state.params, placed)))
    metrics = {"time/critic_values": time.perf_counter() - tic}
    mask = np.asarray(batch["completion_mask"], bool) & valid[:, None]
    kl = None
    if self.kl_coef > 0:
      ref_logp = batch.get("ref_logp")
      if ref_logp is None:
        ref_logp = multihost.to_host(method.scorer.score(
          self.reference, **placed, temperature=config.temperature,
          num_micro_batches=config.score_micro_batches).logp)
      kl = losses.kl_estimate(jnp.where(mask, batch["old_logp"], 0.0),
                              jnp.where(mask, ref_logp, 0.0), estimator="k1")
      metrics["critic/kl_in_reward"] = float(np.sum(np.where(mask, kl, 0.0))
                                             / max(mask.sum(), 1))
    token_rewards = advantages_lib.outcome_token_rewards(jnp.asarray(reward), jnp.asarray(mask),
                                                         kl, self.kl_coef)
    gae = advantages_lib.gae_advantages(token_rewards, jnp.asarray(old_values),
                                        jnp.asarray(mask), gamma=self.gamma, lam=self.lam)
    adv = advantages_lib.whiten(gae.advantages, mask) if self.whiten else gae.advantages
    count = max(int(mask.sum()), 1)
    metrics.update({
      "critic/old_value_mean": float(np.sum(np.where(mask, old_values, 0.0)) / count),
      "critic/return_mean": float(np.sum(np.asarray(gae.returns)) / count),
      "critic/adv_abs_mean": float(np.sum(np.abs(np.asarray(gae.advantages))) / count),
    })
    batch = dict(batch, adv=np.asarray(adv, np.float32), returns=np.asarray(gae.returns),
                 old_values=old_values, value_mask=mask)
    self.pending = {k: batch[k] for k in (*INPUT_KEYS, *CRITIC_KEYS)}
    return batch, metrics

  # ---- after_update: the critic's own PPO phase ----

  def after_update(self, method, ctx) -> dict[str, float]:
    """The `step_parts` hook: `epochs × config.ppo_mini_batches` value updates on the batch
    `transform` built, shuffled by (seed, step) so a resumed run takes the same updates."""
    config = method.config
    batch, self.pending = self.pending, None
    tic = time.perf_counter()
    self.state, updates = ppo.ppo_phase(
      self.step_fn, self.state, batch, epochs=self.epochs,
      mini_batches=config.ppo_mini_batches,
      rng=np.random.default_rng([config.seed, ctx.step, 1]), put=ctx.put,
      mask_key="value_mask")
    merged = ppo.merge_update_metrics(updates)
    return {
      "critic/value_loss": merged["value_loss"],
      "critic/explained_variance": float(losses.explained_variance(merged)),
      "critic/value_mean": merged["value_mean"],
      "critic/clip_frac": merged["clip_frac"],
      "critic/grad_norm": merged["grad_norm"],
      "critic/skipped": merged["skipped"],
      "critic/num_updates": merged["num_updates"],
      "time/critic_update": time.perf_counter() - tic,
    }

  # ---- checkpointed with the run ----

  def sharded_state(self) -> dict[str, object]:
    """The critic's whole `TrainState` (parameters, optimizer state, step, RNG, counters), as
    the loop checkpoints the policy's: sharded, each process writing its own shards."""
    return {"train_state": self.state}

  def load_sharded_state(self, tree) -> None:
    """Restores `sharded_state()` (in the critic's shardings, from the loop)."""
    self.state = tree["train_state"]


def build_critic(config) -> Critic | None:
  """The configured critic (`config.critic` with `enabled=True`), or None (no section, or
  `enabled=False`)."""
  knobs = config.get("critic")
  if knobs is None or not knobs.get("enabled", False):
    return None
  return Critic(config)
