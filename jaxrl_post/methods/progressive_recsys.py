"""Progressive LP → FFT → RFT post-training of a recommender foundation model (arXiv 2608.06792).

"Progressive Alignment of Recommender Foundation Model through Multi-Phase Post-Training"
(NAVER WEBTOON, RecSys 2026 Industry) post-trains a sequential-behaviour foundation model (FM) in
phases: linear probing of new heads on the frozen FM, full fine-tuning with the backbone at a
10× smaller rate, then GRPO against a frozen ordinal reward model. This is its synthetic
analogue (PROPOSAL): `tasks.recommender_log` simulates users, a logging
policy and a 6-level funnel; `models.recommender.RecommenderFM` is the FM with its heads. One
run is one `config.phase`; every phase but `pretrain` starts from the previous run's workdir
(`config.init_from`):

  pretrain  next-item prediction on the users' histories (the FM); only the backbone trains
  sft1      1-phase SFT from pretrain: every module at the base rate
  lp        linear probing from pretrain: backbone frozen (its gradient is cut, and its
            updates are `optax.set_to_zero`), new modules trained
  fft       full fine-tuning from lp: backbone at 0.1 × the base rate
  rft       GRPO from fft: reward and propensity heads frozen, policy head + backbone trained

Which group trains at which multiple of `config.optimizer.lr` is `config.phases.<phase>`
(`training.phases`). One SFT step (sft1 / lp / fft), on a batch of logged requests:

  policy      BCE of f_θ(u, i) against the click (level ≥ 1) of each logged impression
  reward      `losses.ordinal.ordinal_nll` of the funnel level, IPS-weighted with
              w = min(1/p̂, c), self-normalised; p̂ = 1 − (1 − q̂)^S from the propensity head
              (stop-gradient), q̂ = softmax of its exposure logits
  propensity  cross-entropy of the logged items under the propensity head (the logging
              policy's per-draw probabilities)
  loss        w_pol·policy + w_rm·reward + w_prop·propensity

One RFT step, per request (`rft_rollout`): candidates = the current policy's top-`candidates`
(32) items; G items drawn without replacement (Gumbel top-k) from softmax(f/τ) over them;
rewards r = E[level] of the frozen reward model (the reward head of the starting policy, copied
once: it and the reference policy are the same after a restart); A = group z-score
(`advantages.outcome.group_advantages`); then `updates` updates of

  L = clip-surrogate(log π_θ(i), log π_old(i), A)  (`losses.policy.policy_loss`, ε)
      + β · mean_requests KL(π_θ ‖ π_ref)         (exact, over the candidate set)

with π(i | u) = softmax_{candidates}(f/τ) (per-item log-probs: the without-replacement draw is
not corrected for, a PROPOSAL). Evaluation ranks all items for held-out users:
Rank NDCG@k (gain P(click)), Funnel NDCG@k (gain E[level]), deep-engagement rate (mean
P(level ≥ 3) of the top-`deep_top` items), for the policy and for the reward model used as the
ranker (`eval/rm/…`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from jaxrl_post.advantages.outcome import group_advantages
from jaxrl_post.losses.ordinal import expected_level, ips_weights, ordinal_nll
from jaxrl_post.losses.policy import policy_loss
from jaxrl_post.models.recommender import RecommenderFM
from jaxrl_post.parallel.mesh import init_sharded, put_batch
from jaxrl_post.tasks import recommender_log as rl
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.phases import GROUP_RULES, group_labels, phase_optimizer
from jaxrl_post.training.train_state import make_train_step

PHASES = ("pretrain", "sft1", "lp", "fft", "rft")
# The run each phase starts from (its `config.init_from`).
STARTS = {"pretrain": None, "sft1": "pretrain", "lp": "pretrain", "fft": "lp", "rft": "fft"}
GROUPS = tuple(g for g, _ in GROUP_RULES.get("recommender"))


def build_world(config) -> rl.RecsysWorld:
  """The simulator of `config.world` (`tasks.recommender_log.make_world` keywords)."""
  knobs = dict(config.world)
  knobs["deep_thresholds"] = tuple(knobs["deep_thresholds"])
  try:
    return rl.make_world(**knobs)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.world: {e}") from None


# ---- Losses of the model (for `train_state.make_train_step`) ----


def pretrain_loss(model: RecommenderFM, batch):
  """Next-item cross-entropy over history positions 1 … L−1, `batch["history"]` `[B, L]`."""
  history = batch["history"]
  logits = model.backbone.next_item_logits(history)[:, :-1]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, history[:, 1:]).mean()
  return nll, {"next_item_nll": nll}


def make_sft_loss(*, stop_backbone: bool, policy_weight: float, reward_weight: float,
                  propensity_weight: float, ips_clip: float, slate: int):
  """`(model, batch) -> (loss, aux)`: the three supervised terms of the module docstring.

  The batch holds `history [B, L]`, `items [B, S]`, `level [B, S]` (from
  `tasks.recommender_log.sample_logs`). `stop_backbone` (LP) cuts the gradient into the
  backbone.
  """

  def loss(model: RecommenderFM, batch):
    items, level = batch["items"], batch["level"]
    z, table = model.features(batch["history"], stop_backbone=stop_backbone)
    f = model.policy_scores(z, table, items)
    click = (level >= 1).astype(jnp.float32)
    policy = optax.sigmoid_binary_cross_entropy(f, click).mean()
    log_q = jax.nn.log_softmax(model.propensity_logits(z, table))
    log_q_items = jnp.take_along_axis(log_q, items, axis=-1)
    propensity = -log_q_items.mean()
    p_hat = -jnp.expm1(slate * jnp.log1p(-jnp.exp(jax.lax.stop_gradient(log_q_items))))
    w = ips_weights(p_hat, clip=ips_clip)
    reward, aux = ordinal_nll(model.reward_scores(z, table, items), model.thresholds(), level, w)
    total = policy_weight * policy + reward_weight * reward + propensity_weight * propensity
    return total, {"policy_bce": policy, "reward_nll": reward, "propensity_ce": propensity,
                   "reward_accuracy": aux.accuracy, "ips_max_weight": aux.max_weight}

  return loss


def candidate_log_probs(model: RecommenderFM, history, candidates, temperature: float):
  """log softmax_{candidates}(f/τ), `[B, K]` for `candidates` `[B, K]`."""
  z, table = model.features(history)
  return jax.nn.log_softmax(model.policy_scores(z, table, candidates) / temperature, axis=-1)


def make_rft_loss(*, temperature: float, epsilon: float, beta: float):
  """`(model, batch) -> (loss, aux)`: clipped surrogate on the drawn items + β·exact KL.

    L = mean_{b,g} max(−A r, −A clip(r, 1 − ε, 1 + ε)) + β · mean_b Σ_k π_k (log π_k − log π_ref,k)

  The batch holds `history [B, L]`, `candidates [B, K]`, `picks [B, G]` (positions in the
  candidates), `old_logp [B, G]`, `ref_logp [B, K]` and `adv [B, G]`.
  """

  def loss(model: RecommenderFM, batch):
    logp_all = candidate_log_probs(model, batch["history"], batch["candidates"], temperature)
    logp = jnp.take_along_axis(logp_all, batch["picks"], axis=-1)
    b, g = logp.shape
    pg, aux = policy_loss(logp.reshape(b * g, 1), batch["old_logp"].reshape(b * g, 1),
                          batch["adv"].reshape(b * g), jnp.ones((b * g, 1), bool),
                          epsilon_low=epsilon, epsilon_high=epsilon)
    kl = jnp.mean(jnp.sum(jnp.exp(logp_all) * (logp_all - batch["ref_logp"]), axis=-1))
    return pg + beta * kl, {"pg_loss": pg, "kl": kl,
                            "clip_frac": aux.clip_frac_low + aux.clip_frac_high}

  return loss


def gumbel_top_k(key: jax.Array, logits: jax.Array, k: int) -> jax.Array:
  """k indices per row drawn without replacement from softmax(logits): top-k of logits + Gumbel.

  `logits` `[B, K]` → `[B, k]` int32 (Kool et al., arXiv 1903.06059).
  """
  return jax.lax.top_k(logits + jax.random.gumbel(key, logits.shape), k)[1]


def make_rft_rollout(graphdef, *, candidates: int, group_size: int, temperature: float,
                     adv_eps: float):
  """Jitted `(params, ref_params, history, key) -> batch` of one RFT step (module docstring).

  The reward is the frozen model's (`ref_params`) expected funnel level of each drawn item.
  """

  @jax.jit
  def rollout(params, ref_params, history, key):
    model, ref = nnx.merge(graphdef, params), nnx.merge(graphdef, ref_params)
    z, table = model.features(history)
    cands = jax.lax.top_k(model.policy_scores(z, table), candidates)[1]
    logp_all = candidate_log_probs(model, history, cands, temperature)
    picks = gumbel_top_k(key, logp_all, group_size)
    items = jnp.take_along_axis(cands, picks, axis=-1)
    zr, tr = ref.features(history)
    reward = expected_level(ref.reward_scores(zr, tr, items), ref.thresholds())
    b = history.shape[0]
    adv = group_advantages(reward.reshape(-1), jnp.repeat(jnp.arange(b), group_size),
                           num_groups=b, eps=adv_eps).reshape(b, group_size)
    return dict(history=history, candidates=cands, picks=picks,
                old_logp=jnp.take_along_axis(logp_all, picks, axis=-1),
                ref_logp=candidate_log_probs(ref, history, cands, temperature),
                adv=adv, reward=reward)

  return rollout


def make_rankers(graphdef):
  """Jitted `(params, history) -> (policy scores, RM expected level)`, both `[B, I]`."""

  @jax.jit
  def rankers(params, history):
    model = nnx.merge(graphdef, params)
    z, table = model.features(history)
    return (model.policy_scores(z, table),
            expected_level(model.reward_scores(z, table), model.thresholds()))

  return rankers


def ranking_metrics(scores: np.ndarray, gains: Mapping[str, np.ndarray], *, k: int,
                    deep_top: int) -> dict[str, float]:
  """Rank NDCG@k (click gains), Funnel NDCG@k (level gains), top-`deep_top` deep and click
  rates of one ranker's `[B, I]` scores."""
  return {"rank_ndcg": float(rl.ndcg_at_k(scores, gains["click"], k).mean()),
          "funnel_ndcg": float(rl.ndcg_at_k(scores, gains["level"], k).mean()),
          "deep_rate": float(rl.top_k_mean(scores, gains["deep"], deep_top).mean()),
          "click_rate": float(rl.top_k_mean(scores, gains["click"], deep_top).mean())}


def phase_steps(config) -> int:
  """The steps `config.phase` trains (`configs/progressive_recsys.py` sets `config.steps`)."""
  return {"pretrain": config.pretrain_steps, "sft1": config.lp_steps + config.fft_steps,
          "lp": config.lp_steps, "fft": config.fft_steps, "rft": config.rft_steps}[config.phase]


def _scaled_optimizer_config(config, multiplier: float):
  """`{"optimizer": config.optimizer with lr × multiplier}` for `setup.build_optimizer`."""
  opt = ml_collections.ConfigDict(config.optimizer.to_dict())
  opt.lr = float(config.optimizer.lr) * multiplier
  return ml_collections.ConfigDict({"optimizer": opt})


class ProgressiveRecsys:
  """One phase of progressive LP → FFT → RFT on the simulated recommender; a
  `training.loop.Method` (configs/progressive_recsys.py)."""

  name = "progressive_recsys"

  def __init__(self, config):
    if config.phase not in PHASES:
      raise ValueError(f"config.phase={config.phase!r}; valid: {', '.join(PHASES)}")
    self.config, self.phase = config, config.phase
    if config.steps != phase_steps(config):
      raise ValueError(f"config.steps={config.steps} but config.phase={self.phase!r} trains "
                       f"{phase_steps(config)} steps: pick the phase with the config argument "
                       f"(configs/progressive_recsys.py:phase={self.phase})")
    if STARTS[self.phase] and not (config.init_from or config.resume):
      raise ValueError(f"config.init_from: phase {self.phase!r} starts from the "
                       f"{STARTS[self.phase]!r} run's workdir (scripts/progressive_recsys_grid.py)")
    if self.phase not in config.phases:
      raise ValueError(f"config.phases has no {self.phase!r} entry; it has "
                       f"{', '.join(config.phases)}")
    self.updates_per_step = int(config.rft.updates) if self.phase == "rft" else 1
    if self.updates_per_step < 1:
      raise ValueError(f"config.rft.updates={config.rft.updates} must be >= 1")

  # ---- Set-up ----

  def build_model(self, run: loop.Run):
    config = self.config
    self.world = build_world(config)
    rft = config.rft
    if not 1 <= rft.group_size <= rft.candidates <= self.world.num_items:
      raise ValueError(f"config.rft: need 1 <= group_size ({rft.group_size}) <= candidates "
                       f"({rft.candidates}) <= num_items ({self.world.num_items})")
    if config.batch_size > len(self.world.train_users):
      raise ValueError(f"config.batch_size={config.batch_size} exceeds the "
                       f"{len(self.world.train_users)} training users")
    # The fixed logged data set of the supervised phases (`num_log_requests` requests of
    # training users, drawn once per world); 0: fresh logs every step.
    n = config.num_log_requests
    if n and n < config.batch_size:
      raise ValueError(f"config.num_log_requests={n} is below config.batch_size="
                       f"{config.batch_size}")
    rng = np.random.default_rng([config.world.seed, 1])
    self.logs = (rl.sample_logs(self.world, rng.choice(self.world.train_users, n), rng)
                 if n else None)

    def make():
      return RecommenderFM(self.world.num_items, dim=config.model.dim,
                           num_levels=rl.NUM_LEVELS, rngs=nnx.Rngs(config.seed))

    return init_sharded(make, run.train_mesh, run.train_rules)

  def optimizer(self, run: loop.Run, total_updates: int) -> optax.GradientTransformation:
    """Per-group `config.optimizer` at lr × `config.phases.<phase>.<group>`; 0 = frozen."""
    config, rules = self.config, GROUP_RULES.get("recommender")
    return phase_optimizer(
      dict(config.phases[self.phase]), lambda params: group_labels(params, rules),
      lambda m: run_setup.build_optimizer(_scaled_optimizer_config(config, m), total_updates),
      groups=GROUPS, key=f"config.phases.{self.phase}")

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    loss = config.loss
    if self.phase == "pretrain":
      loss_fn = pretrain_loss
    elif self.phase == "rft":
      loss_fn = make_rft_loss(temperature=config.rft.temperature, epsilon=config.rft.epsilon,
                              beta=config.rft.beta)
    else:
      loss_fn = make_sft_loss(stop_backbone=self.phase == "lp", policy_weight=loss.policy,
                              reward_weight=loss.reward, propensity_weight=loss.propensity,
                              ips_clip=loss.ips_clip, slate=self.world.slate)
    self.step_fn = make_train_step(run.graphdef, loss_fn, run.optimizer, mesh=run.train_mesh,
                                   rules=run.train_rules)
    self.rankers = make_rankers(run.graphdef)
    # The frozen reward model and reference policy: the starting policy, copied once.
    self.reference = jax.tree.map(jnp.copy, state.params) if self.phase == "rft" else None
    if self.phase == "rft":
      r = config.rft
      self.rollout = make_rft_rollout(run.graphdef, candidates=r.candidates,
                                      group_size=r.group_size, temperature=r.temperature,
                                      adv_eps=r.adv_eps)
    users = self.world.eval_users
    self.eval_history = self.world.histories[users]
    self.eval_gains = rl.expected_gains(self.world, users)
    self.started = time.perf_counter()

  def state_dict(self) -> dict[str, Any]:
    return {}  # A step's users, logs and draws are functions of (seed, phase, step).

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    del state

  def put(self, batch):
    return put_batch(batch, self.run.train_mesh, self.run.train_rules)

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The requests of `step`: `batch_size` rows of the logged data set (without replacement),
    or fresh logs of as many training users when `config.num_log_requests` is 0; pretraining
    and RFT read only their histories."""
    rng = np.random.default_rng([self.config.seed, PHASES.index(self.phase), step])
    if self.logs is not None and self.phase not in ("pretrain", "rft"):
      rows = rng.choice(len(self.logs["items"]), self.config.batch_size, replace=False)
      return {k: v[rows] for k, v in self.logs.items()}
    users = rng.choice(self.world.train_users, self.config.batch_size, replace=False)
    return rl.sample_logs(self.world, users, rng)

  # ---- One step ----

  def step(self, state, step: int):
    tic = time.perf_counter()
    logs = self.batch(step)
    if self.phase == "rft":
      key = jax.random.fold_in(jax.random.key(self.config.seed + 1), step)
      batch = self.rollout(state.params, self.reference, self.put(logs["history"]), key)
      reward = np.asarray(batch.pop("reward"))
      records = []
      for _ in range(self.updates_per_step):
        state, metrics = self.step_fn(state, batch)
        records.append(run_setup.host_metrics(metrics))
      record = {f"train/{k}": v for k, v in records[-1].items()}
      record.update({"train/first_kl": records[0]["kl"], "reward/mean": float(reward.mean()),
                     "reward/std_within": float(reward.std(axis=1).mean())})
    else:
      keys = ("history",) if self.phase == "pretrain" else ("history", "items", "level")
      state, metrics = self.step_fn(state, self.put({k: logs[k] for k in keys}))
      record = {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    record["time/step"] = time.perf_counter() - tic
    return state, record

  # ---- Evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, Any]:
    config = self.config
    policy, rm = (np.asarray(x) for x in self.rankers(state.params,
                                                       self.put(self.eval_history)))
    k, top = config.eval.ndcg_k, config.eval.deep_top
    result = ranking_metrics(policy, self.eval_gains, k=k, deep_top=top)
    result |= {f"rm/{name}": v for name, v in ranking_metrics(
      rm, self.eval_gains, k=k, deep_top=top).items()}
    if step == config.steps and jax.process_index() == 0:
      final = dict(result, phase=self.phase, seed=config.seed,
                   **{"time/run": time.perf_counter() - self.started})
      (self.run.workdir / "final.json").write_text(json.dumps(final, indent=1) + "\n")
    return {f"eval/{k}": v for k, v in result.items()}

  def progress(self, record):
    if self.phase == "rft":
      return {"r": record["reward/mean"], "kl": record["train/kl"]}
    return {"loss": record["train/loss"]}

  def summary(self, records) -> str:
    evals = [r for r in records if "eval/rank_ndcg" in r]
    if not evals:
      return ""
    last = evals[-1]
    return (f"seed {self.config.seed} {self.phase} step {last['step']}: Rank NDCG "
            f"{float(last['eval/rank_ndcg']):.3f}  Funnel NDCG "
            f"{float(last['eval/funnel_ndcg']):.3f}  deep rate "
            f"{float(last['eval/deep_rate']):.3f}  (RM as ranker "
            f"{float(last['eval/rm/rank_ndcg']):.3f} / {float(last['eval/rm/funnel_ndcg']):.3f})")
