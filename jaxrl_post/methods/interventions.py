"""RAIL (arXiv 2608.05080) in a GRPO-family step: a contextual bandit decides which groups get
extra rollouts, and learns from the improvement they realise.

PROPOSAL reconstruction throughout (the paper publishes the rule a*(z) = argmax_a E[ΔR(z, a) −
λ·C(a)], the realised-gain reward and the shadow-to-live procedure, not the details). After the
step's G rollouts per prompt are verified (the part's `rewards` hook), per group:

  context z    `sampling.interventions.context_features`: bias, turn position (0: single
               turn), entropy proxy (the group's mean per-token −log π of its sampled tokens),
               success rate p̂, reward variance, rollouts spent on this pool prompt so far /
               `rollout_budget`;
  arms         "none", and "restart" (new rollouts from the prompt) × m ∈ `extra_rollouts` ×
               T ∈ `temperatures` (`default_arms`). Restart only: single-turn GRPO has no turns
               to branch at (the branch arms belong to a multi-turn host, out of scope here);
  controller   discounted LinUCB ("linucb", or "lints") on φ(z, a) = vec(a ⊗ z)
               (`jaxrl_post.bandits`);
  heuristic    intervene (the arm with the most extra rollouts, at the temperature nearest
               `config.temperature`) when the group is all-0 or all-1 (no GRPO signal), else
               "none";
  shadow→live  the heuristic acts, with ε random arms, while the bandit learns; once the
               bandit's LCB of its own pick beats its predicted utility of the heuristic's pick
               for `window` decisions in a row it acts (`shadow_to_live_update`, `choose_arm`).
               `switch` picks the rule: "streak" (that one), "share" (a share ≥ `min_share`
               of wins among the last `window` decisions, this project's PROPOSAL) or "live"
               (the bandit acts from the first decision: the ablation without a shadow phase,
               a direct bandit-vs-heuristic comparison).
               A decision where the two pick the same arm has nothing to compare (the arm's
               LCB against its own mean, a sure loss); PROPOSAL `on_agreement="hold"` leaves
               the streak as it is, "reset" counts it as a loss. Logged per step:
               `rail/agree_share`, `rail/win_share` and `rail/margin` (docs/results.md, RAIL:
               at α = 1 the LCB misses by ≈ 0.6, so the switch does not fire at this scale).

The executed interventions are sampled (one `generate` per temperature in use, each padded to
`max_groups` prompts × max m samples, so every step has the same shapes), verified, and their
groups' gain g (`realised_gain`: "coverage" = the group became mixed, or "variance") minus the
token cost, u = g − λ·tokens / (G · max_new_tokens) (`utility`), updates the bandit with the
executed arm's features. A step intervenes on at most `max_groups` groups (the first, in batch
order); a pick beyond that is executed as "none". The policy update is unchanged GRPO over the
*enlarged* groups (the objective's advantage estimator over each group's G + m rollouts), so the
fresh rows' advantages change too. The actor batch always carries `max_groups × max m` extra
rows (after the fresh ones): unused rows have an empty completion mask, so they count neither in
the loss nor in its token / sequence normalisers, and the update never recompiles. Their
`old_logp` is scored by the trainer at `config.temperature` like the fresh rows (PROPOSAL: rows
drawn at another temperature are then slightly off-policy; the PPO ratio corrects for it).

`mode` = "rail" (the above) or "heuristic" (the baseline: the heuristic always acts, no ε, the
bandit still learns and is logged). The bandit, the switch and the per-prompt rollout counts are
the part's checkpointed arrays; the random arms and samples are functions of (seed, step), so a
resumed run repeats the uninterrupted one.

References:
  RAIL: Optimizing What Policies Learn From: Recoverability-aware Rollout Intervention Learning,
  arXiv 2608.05080.
  Li et al., A Contextual-Bandit Approach to Personalized News Article Recommendation (LinUCB),
  arXiv 1003.0146.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import bandits
from jaxrl_post.advantages.outcome import combine_rewards
from jaxrl_post.methods.group_replay import concat_rows
from jaxrl_post.parallel import multihost
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import interventions as iv

MODES = ("rail", "heuristic")
AGREEMENT_RULES = ("hold", "reset")
# The switch's rules (`sampling.interventions.SWITCH_RULES`) and "live": no shadow phase.
SWITCHES = (*iv.SWITCH_RULES, "live")
# PROPOSAL: a decision where controller and heuristic agree neither wins nor loses.
ON_AGREEMENT = "hold"
# Independent random streams of one (seed, step): the shadow-mode arm draws, the samples.
ARM_STREAM = 0x5241
SAMPLE_STREAM = 0x534D


class GroupStats(NamedTuple):
  """Per-group statistics of the step's fresh rollouts (host arrays)."""

  success: np.ndarray  # float32 [B] mean reward p̂ (NaN rows skipped)
  variance: np.ndarray  # float32 [B] population variance of the reward
  uniform: np.ndarray  # bool [B] all valid rewards equal (no GRPO signal)
  entropy: np.ndarray  # float32 [B] mean −log π per sampled token


def group_stats(reward: np.ndarray, logp: np.ndarray, mask: np.ndarray,
                group_size: int) -> GroupStats:
  """`reward [B·G]` (NaN: ungraded), `logp` / `mask [B·G, T]` → `GroupStats`.

  Examples:
    >>> s = group_stats(np.array([1.0, 0.0, 1.0, 1.0]), -np.ones((4, 2)), np.ones((4, 2), bool), 2)
    >>> s.success.tolist(), s.variance.tolist(), s.uniform.tolist(), s.entropy.tolist()
    ([0.5, 1.0], [0.25, 0.0], [False, True], [1.0, 1.0])
  """
  r = np.asarray(reward, np.float64).reshape(-1, group_size)
  valid = np.isfinite(r)
  n = np.maximum(valid.sum(axis=1), 1)
  mean = np.where(valid, r, 0.0).sum(axis=1) / n
  var = np.where(valid, (r - mean[:, None]) ** 2, 0.0).sum(axis=1) / n
  hi = np.where(valid, r, -np.inf).max(axis=1)
  lo = np.where(valid, r, np.inf).min(axis=1)
  uniform = ~(hi - lo > 1e-6)
  m = np.asarray(mask, bool).reshape(len(r), group_size, -1)
  lp = np.asarray(logp, np.float64).reshape(m.shape)
  entropy = -np.where(m, lp, 0.0).sum(axis=(1, 2)) / np.maximum(m.sum(axis=(1, 2)), 1)
  return GroupStats(mean.astype(np.float32), var.astype(np.float32), uniform,
                    entropy.astype(np.float32))


def heuristic_arm(arms: Sequence[iv.InterventionArm], uniform: bool, temperature: float) -> int:
  """The default rule: the most extra rollouts (temperature nearest `temperature`) for a group
  with no signal (all-0 or all-1), else "none" (index of the first "none" arm, else 0).

  Examples:
    >>> arms = iv.default_arms(wheres=("restart",), extra_rollouts=(2, 4), temperatures=(1.0,))
    >>> heuristic_arm(arms, True, 1.0), heuristic_arm(arms, False, 1.0)
    (2, 0)
  """
  if not uniform:
    return next((i for i, a in enumerate(arms) if a.where == "none"), 0)
  return min(range(len(arms)), key=lambda i: (-arms[i].extra_rollouts,
                                              abs(arms[i].temperature - temperature), i))


class Decision(NamedTuple):
  """`Interventions.decide`'s per-group choice (host arrays)."""

  arm: np.ndarray  # int32 [B] executed arm
  source: np.ndarray  # int32 [B] SOURCE_HEURISTIC / SOURCE_RANDOM / SOURCE_CONTROLLER
  features: np.ndarray  # float32 [B, n_arms, d] φ(z, a) of every arm
  slot: np.ndarray  # int32 [B] extra-rollout slot of the group, −1 when none
  # float32 [B] the switch's test, LCB of the controller's arm − predicted utility of the
  # heuristic's (> 0: a win), and bool [B] whether the two picked the same arm.
  margin: np.ndarray
  agree: np.ndarray


class Interventions:
  """RAIL's intervention bandit for a GRPO-family step; see the module docstring."""

  def __init__(self, config):
    knobs = config.intervention
    if knobs.mode not in MODES:
      raise ValueError(f"config.intervention.mode={knobs.mode!r}; valid: none, "
                       f"{', '.join(MODES)}")
    if knobs.bandit not in bandits.BANDITS:
      raise ValueError(f"config.intervention.bandit={knobs.bandit!r}; valid: "
                       f"{', '.join(bandits.BANDITS.names())}")
    if knobs.gain not in iv.GAIN_KINDS:
      raise ValueError(f"config.intervention.gain={knobs.gain!r}; valid: "
                       f"{', '.join(iv.GAIN_KINDS)}")
    for section, key in (("world_model", "name"), ("rubric", "mode")):
      other = config.get(section)
      if other is not None and other[key] != "none":
        raise ValueError(f"config.intervention and config.{section} both set the step's "
                         f"advantages; set config.{section}.{key} = 'none'")
    if config.loss.beta > 0:
      raise ValueError("config.intervention needs config.loss.beta = 0: the extra rows have no "
                       "reference log-probs")
    for key in ("max_groups", "window", "rollout_budget"):
      if knobs[key] < 1:
        raise ValueError(f"config.intervention.{key} must be >= 1, got {knobs[key]}")
    if not 0.0 <= knobs.epsilon <= 1.0:
      raise ValueError(f"config.intervention.epsilon must be in [0, 1], got {knobs.epsilon}")
    if not 0.0 < knobs.gamma <= 1.0:
      raise ValueError(f"config.intervention.gamma must be in (0, 1], got {knobs.gamma}")
    # Configs written before the knob existed get the PROPOSAL default.
    on_agreement = knobs.get("on_agreement", ON_AGREEMENT)
    if on_agreement not in AGREEMENT_RULES:
      raise ValueError(f"config.intervention.on_agreement={on_agreement!r}; valid: "
                       f"{', '.join(AGREEMENT_RULES)}")
    self.hold_on_agreement = on_agreement == "hold"
    self.switch_rule = knobs.get("switch", "streak")
    if self.switch_rule not in SWITCHES:
      raise ValueError(f"config.intervention.switch={self.switch_rule!r}; valid: "
                       f"{', '.join(SWITCHES)}")
    # The library's rule the record is kept under ("live" starts live; its record is still
    # logged, under the streak rule, which never changes an already live switch).
    self.record_rule = "streak" if self.switch_rule == "live" else self.switch_rule
    self.min_share = float(knobs.get("min_share", iv.RAIL_MIN_SHARE))
    if not 0.0 < self.min_share <= 1.0:
      raise ValueError(f"config.intervention.min_share must be in (0, 1], got {self.min_share}")
    for key in ("alpha", "cost_weight"):
      if not knobs[key] >= 0:
        raise ValueError(f"config.intervention.{key} must be >= 0, got {knobs[key]}")
    if not len(knobs.extra_rollouts) or not len(knobs.temperatures):
      raise ValueError("config.intervention.extra_rollouts and config.intervention.temperatures "
                       "must each name at least one value (the bandit needs arms besides 'none')")
    try:
      self.arms = iv.default_arms(wheres=("restart",), extra_rollouts=tuple(knobs.extra_rollouts),
                                  temperatures=tuple(knobs.temperatures))
    except ValueError as e:
      raise ValueError(f"config.intervention.extra_rollouts / temperatures: {e}") from None
    self.max_m = max(a.extra_rollouts for a in self.arms)
    self.extra_rows = knobs.max_groups * self.max_m
    rows = config.prompts_per_step * config.group_size + self.extra_rows
    if rows % (config.ppo_mini_batches * config.num_micro_batches):
      raise ValueError(f"config.ppo_mini_batches × config.num_micro_batches must divide the "
                       f"{rows} rows of a step with interventions (prompts_per_step × "
                       f"group_size + config.intervention.max_groups × max extra_rollouts)")
    if self.extra_rows % config.score_micro_batches:
      raise ValueError(f"config.score_micro_batches ({config.score_micro_batches}) must divide "
                       f"the {self.extra_rows} extra rows (config.intervention.max_groups × max "
                       f"extra_rollouts)")
    self.config, self.knobs = config, knobs
    self.group_size = config.group_size
    self.arm_feats = iv.arm_features(self.arms, rollout_scale=float(self.max_m))
    self.dim = int(self.arm_feats.shape[1]) * iv.CONTEXT_BASE_DIM
    self.bandit = bandits.linucb_init(self.dim, reg=float(knobs.reg))
    self.switch = iv.shadow_to_live_init(int(knobs.window), live=self.switch_rule == "live")
    self.spent = np.zeros(config.num_train_examples, np.int64)
    self.pending: dict[str, Any] | None = None
    self.params = None

  # ---- decide ----

  def contexts(self, stats: GroupStats, pool: np.ndarray) -> np.ndarray:
    """`float32 [B, n_arms, d]`: φ(z_b, a) for every group and arm."""
    out = []
    for b in range(len(pool)):
      z = iv.context_features(
        turn_position=0.0, entropy=float(stats.entropy[b]), success_rate=float(stats.success[b]),
        reward_variance=float(stats.variance[b]), rollouts_spent=float(self.spent[pool[b]]),
        rollout_budget=float(self.knobs.rollout_budget))
      out.append(np.asarray(iv.joint_features(z, self.arm_feats)))
    return np.stack(out).astype(np.float32)

  def decide(self, stats: GroupStats, pool: np.ndarray, *, seed: int, step: int) -> Decision:
    """Per group: the controller's and the heuristic's arms, the switch, the executed arm."""
    knobs = self.knobs
    features = self.contexts(stats, pool)
    select = bandits.BANDITS.get(knobs.bandit)
    key = jax.random.fold_in(jax.random.key(seed), ARM_STREAM)
    key = jax.random.fold_in(key, step)
    arms, sources, margins, agrees = [], [], [], []
    for b in range(len(pool)):
      phi = jnp.asarray(features[b])
      scores = bandits.linucb_scores(self.bandit, phi, alpha=float(knobs.alpha))
      group_key = jax.random.fold_in(key, b)
      if knobs.bandit == "linucb":
        controller = int(jnp.argmax(scores.ucb))
      else:
        controller = int(select(self.bandit, phi, jax.random.fold_in(group_key, 1),
                                scale=float(knobs.alpha)))
      heuristic = heuristic_arm(self.arms, bool(stats.uniform[b]), self.config.temperature)
      margins.append(float(scores.lcb[controller] - scores.mean[heuristic]))
      agrees.append(controller == heuristic)
      if knobs.mode == "heuristic":
        arm, source = heuristic, iv.SOURCE_HEURISTIC
      else:
        choice = iv.choose_arm(self.switch, group_key, controller_arm=controller,
                               heuristic_arm=heuristic, num_arms=len(self.arms),
                               epsilon=float(knobs.epsilon))
        arm, source = int(choice.arm), int(choice.source)
        # The switch learns from every decision: the bandit's pessimistic value of its own
        # pick against its predicted value of the heuristic's.
        agree = controller == heuristic and self.hold_on_agreement
        self.switch = iv.shadow_to_live_update(
          self.switch, scores.lcb[controller], scores.mean[heuristic], window=knobs.window,
          agree=agree, rule=self.record_rule, min_share=self.min_share)
      arms.append(arm)
      sources.append(source)
    arm = np.asarray(arms, np.int32)
    slot = np.full(len(pool), -1, np.int32)
    used = 0
    for b in range(len(pool)):
      if self.arms[arm[b]].extra_rollouts > 0:
        if used < knobs.max_groups:
          slot[b], used = used, used + 1
        else:  # over the step's budget of intervened groups: executed as "none"
          arm[b] = heuristic_arm(self.arms, False, self.config.temperature)
    return Decision(arm, np.asarray(sources, np.int32), features, slot,
                    np.asarray(margins, np.float32), np.asarray(agrees, bool))

  # ---- sample, verify, advantages, bandit update ----

  def begin_step(self, method, state, step: int) -> dict[str, float]:
    """The `step_parts` hook: keeps the step's policy parameters for the extra rollouts."""
    del method, step
    self.params = state.params
    return {}

  def sample_extra(self, method, params, records, decision: Decision, step: int):
    """The extra rollouts: `max_groups × max_m` rows (row s·max_m + j is sample j of slot s),
    one `generate` per temperature in use; returns host arrays and each row's validity."""
    k, m_max = self.knobs.max_groups, self.max_m
    config = self.config
    width = config.max_new_tokens
    tokens = np.zeros((k * m_max, width), np.int32)
    mask = np.zeros((k * m_max, width), bool)
    logp = np.zeros((k * m_max, width), np.float32)
    prompt_tokens = prompt_mask = None
    valid = np.zeros(k * m_max, bool)
    texts = [""] * (k * m_max)
    chosen = [b for b in range(len(records)) if decision.slot[b] >= 0]
    params = method.evaluator.sampler_params(params)[0] if chosen else None
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), SAMPLE_STREAM),
                             step)
    for temperature in sorted({self.arms[decision.arm[b]].temperature for b in chosen}):
      slots = [b for b in chosen if self.arms[decision.arm[b]].temperature == temperature]
      # Fixed shape: `max_groups` prompts (padded with the first) × max m samples.
      prompts = [records[b]["prompt"] for b in slots]
      prompts += [prompts[0]] * (k - len(prompts))
      rollout = method.sampler.generate(
        params, prompts, n_samples_per_prompt=m_max, max_new_tokens=width,
        temperature=float(temperature), top_k=config.top_k, top_p=config.top_p,
        rng=jax.random.fold_in(key, int(round(temperature * 1000))))
      host = multihost.to_host({"prompt_tokens": rollout.prompt_tokens,
                                "prompt_mask": rollout.prompt_mask,
                                "completion_tokens": rollout.completion_tokens,
                                "completion_mask": rollout.completion_mask,
                                "logp": rollout.logp})
      decoded = method.sampler.decode_text(rollout)
      if prompt_tokens is None:
        p = host["prompt_tokens"].shape[1]
        prompt_tokens = np.zeros((k * m_max, p), np.int32)
        prompt_mask = np.zeros((k * m_max, p), bool)
      for i, b in enumerate(slots):
        s, m = decision.slot[b], self.arms[decision.arm[b]].extra_rollouts
        src, dst = slice(i * m_max, i * m_max + m), slice(s * m_max, s * m_max + m)
        tokens[dst] = host["completion_tokens"][src]
        mask[dst] = host["completion_mask"][src]
        logp[dst] = host["logp"][src]
        prompt_tokens[dst] = host["prompt_tokens"][src]
        prompt_mask[dst] = host["prompt_mask"][src]
        valid[dst] = True
        texts[dst] = decoded[src]
    return dict(completion_tokens=tokens, completion_mask=mask, logp=logp,
                prompt_tokens=prompt_tokens, prompt_mask=prompt_mask), valid, texts

  def rewards(self, method, ctx):
    """The `step_parts` hook: decide, sample and verify the interventions, update the bandit,
    and return the advantages of the fresh rows over the enlarged groups."""
    tic = time.perf_counter()
    config, knobs, g = self.config, self.knobs, self.group_size
    records = ctx.records
    b_size = len(records)
    pool = np.asarray([int(r["index"]) for r in records])
    # A call-time import: `methods.grpo` imports the step parts, this module among them.
    from jaxrl_post.methods.grpo import reward_matrix

    weights = np.asarray(method.objective.reward_weights, np.float32)

    def scalar(matrix):
      return np.asarray(combine_rewards(jnp.asarray(matrix), jnp.asarray(weights)).reward)

    rollout = multihost.to_host({"logp": ctx.rollout.logp,
                                 "completion_mask": ctx.rollout.completion_mask})
    fresh = ctx.verified.rewards
    if fresh is None:
      fresh = reward_matrix(method.objective, ctx.verified.correct, ctx.verified.format,
                            config, lengths=np.asarray(rollout["completion_mask"]).sum(axis=1))
    fresh = np.asarray(fresh, np.float32)
    reward = scalar(fresh)
    stats = group_stats(reward, rollout["logp"], rollout["completion_mask"], g)
    decision = self.decide(stats, pool, seed=config.seed, step=ctx.step)
    if self.params is None:
      raise ValueError("the intervention part's rewards hook ran before its begin_step hook")
    extra, valid, texts = self.sample_extra(method, self.params, records, decision, ctx.step)
    self.params = None
    # Verify the extra rows slot by slot (an unused row is verified as "" and then dropped).
    slot_records = [records[0]] * knobs.max_groups
    for b in range(b_size):
      if decision.slot[b] >= 0:
        slot_records[decision.slot[b]] = records[b]
    correct, fmt, _ = rewards_for(method.task, slot_records, texts, self.max_m,
                                  timeout_s=config.reward_timeout_s)
    # The same reward columns as the fresh rows' (an "overlong" column from these rows' lengths).
    extra_matrix = reward_matrix(method.objective, correct, fmt, config,
                                 lengths=np.asarray(extra["completion_mask"]).sum(axis=1))
    extra_matrix = np.where(valid[:, None], extra_matrix, np.nan).astype(np.float32)
    extra_reward = np.where(valid, scalar(extra_matrix), np.nan).astype(np.float32)
    owner = np.full(self.extra_rows, b_size, np.int32)  # unused rows: a dummy group
    for b in range(b_size):
      if decision.slot[b] >= 0:
        s = decision.slot[b]
        owner[s * self.max_m:(s + 1) * self.max_m] = np.where(
          valid[s * self.max_m:(s + 1) * self.max_m], b, b_size)
    out = self.update(decision, reward, extra_reward, owner, extra["completion_mask"], pool)
    # GRPO over the enlarged groups: fresh rows and the extra rows of their group.
    all_rewards = np.concatenate([fresh, extra_matrix])
    group_ids = np.concatenate([np.asarray(ctx.rollout.group_ids, np.int32), owner])
    adv = np.asarray(method.objective.advantage_fn(
      jnp.asarray(all_rewards), jnp.asarray(group_ids), num_groups=b_size + 1,
      eps=config.advantage_eps, reward_weights=method.objective.reward_weights))
    fresh_rows = b_size * g
    extra_batch = {k: extra[k] for k in ("prompt_tokens", "prompt_mask", "completion_tokens")}
    extra_batch["completion_mask"] = extra["completion_mask"] & valid[:, None]
    extra_batch["adv"] = np.where(valid, adv[fresh_rows:], 0.0).astype(np.float32)
    self.pending = extra_batch
    metrics = {**out, "time/intervention": time.perf_counter() - tic}
    return ctx.verified._replace(adv=jnp.asarray(adv[:fresh_rows], jnp.float32)), metrics

  def update(self, decision: Decision, reward: np.ndarray, extra_reward: np.ndarray,
             owner: np.ndarray, extra_mask: np.ndarray, pool: np.ndarray) -> dict[str, float]:
    """Realised gains and utilities of the executed arms; the bandit and the rollout counts
    learn from them. Returns the step's metrics."""
    knobs, g = self.knobs, self.group_size
    b_size = len(pool)
    before = reward.reshape(b_size, g)
    width = g + self.max_m
    after = np.full((b_size, width), np.nan, np.float32)
    after[:, :g] = before
    tokens = np.zeros(b_size, np.float32)
    for b in range(b_size):
      rows = np.nonzero(owner == b)[0]
      after[b, g:g + len(rows)] = extra_reward[rows]
      tokens[b] = float(np.asarray(extra_mask)[rows].sum())
    gain = np.asarray(iv.realised_gain(
      np.nan_to_num(before), np.nan_to_num(after), kind=knobs.gain,
      valid_before=np.isfinite(before), valid_after=np.isfinite(after)))
    budget = float(g * self.config.max_new_tokens)
    u = np.asarray(iv.utility(gain, tokens, budget=budget, cost_weight=float(knobs.cost_weight)))
    for b in range(b_size):
      x = jnp.asarray(decision.features[b, decision.arm[b]])
      self.bandit = bandits.linucb_update(self.bandit, x, float(u[b]), gamma=float(knobs.gamma))
      self.spent[pool[b]] += g + int((owner == b).sum())
    acted = decision.slot >= 0
    return {
      "rail/interventions": float(acted.sum()),
      "rail/extra_rows": float((owner < b_size).sum()),
      "rail/extra_tokens": float(tokens.sum()),
      "rail/gain": float(gain[acted].mean()) if acted.any() else 0.0,
      "rail/utility": float(u.mean()),
      "rail/mixed_before": float(_mixed(before).mean()),
      "rail/mixed_after": float(_mixed(after).mean()),
      "rail/live": float(bool(self.switch.live)),
      "rail/streak": float(int(self.switch.streak)),
      "rail/window_share": float(iv.win_share(self.switch)),
      "rail/controller_share": float((decision.source == iv.SOURCE_CONTROLLER).mean()),
      "rail/random_share": float((decision.source == iv.SOURCE_RANDOM).mean()),
      # How far the shadow controller is from going live: how often it disagrees with the
      # heuristic, and by how much its LCB misses (or beats) the heuristic when it does.
      "rail/agree_share": float(decision.agree.mean()),
      "rail/win_share": float((decision.margin[~decision.agree] > 0).sum()
                              / max(int((~decision.agree).sum()), 1)),
      "rail/margin": (float(decision.margin[~decision.agree].mean())
                      if (~decision.agree).any() else 0.0),
    }

  def transform(self, method, state, batch, ctx):
    """The `step_parts` hook: the step's batch plus the fixed block of extra rows, their
    `old_logp` scored by the trainer."""
    extra = self.pending
    if extra is None:
      raise ValueError("the intervention part's transform ran before its rewards hook")
    self.pending = None
    tic = time.perf_counter()
    extra = dict(extra, **_fit_prompts(extra, batch))
    inputs = ctx.put({k: extra[k] for k in ("prompt_tokens", "prompt_mask", "completion_tokens",
                                            "completion_mask")})
    logp = method.scorer.score(state.params, **inputs, temperature=self.config.temperature,
                               num_micro_batches=self.config.score_micro_batches).logp
    extra = dict(extra, old_logp=np.where(extra["completion_mask"],
                                          multihost.to_host(logp), 0.0).astype(np.float32))
    extra = {k: extra[k] for k in batch}
    merged = concat_rows(batch, extra, multiple=self.config.trim_completions_to)
    return merged, {"time/intervention_score": time.perf_counter() - tic}

  def array_state(self) -> dict[str, Any]:
    return {"bandit": {k: np.asarray(v) for k, v in self.bandit._asdict().items()},
            "switch": {k: np.asarray(v) for k, v in self.switch._asdict().items()},
            "spent": np.asarray(self.spent)}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.bandit = bandits.LinearBanditState(**{k: jnp.asarray(arrays["bandit"][k])
                                               for k in bandits.LinearBanditState._fields})
    # Checkpoints written before the share rule have no `recent` / `counted`: start them empty.
    fresh = iv.shadow_to_live_init(int(self.knobs.window))._asdict()
    self.switch = iv.ShadowToLiveState(**{k: jnp.asarray(arrays["switch"].get(k, fresh[k]))
                                          for k in iv.ShadowToLiveState._fields})
    self.spent = np.asarray(arrays["spent"], np.int64).copy()


def _fit_prompts(extra: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The extra rows' left-padded prompts at the fresh batch's prompt width. The intervened
  prompts are some of the fresh ones, so cutting columns on the left only drops padding. Unused
  rows get the fresh batch's first prompt (their completion mask is empty: a real prompt keeps
  their forward pass finite, since an all-padding row could give NaN that a 0 mask keeps)."""
  fresh_tokens = np.asarray(batch["prompt_tokens"])
  fresh_mask = np.asarray(batch["prompt_mask"], bool)
  width, rows = fresh_tokens.shape[1], len(extra["completion_tokens"])
  out = {"prompt_tokens": np.repeat(fresh_tokens[:1], rows, axis=0),
         "prompt_mask": np.repeat(fresh_mask[:1], rows, axis=0)}
  if extra["prompt_tokens"] is None:
    return out
  used = np.asarray(extra["prompt_mask"], bool).any(axis=1)
  for key in ("prompt_tokens", "prompt_mask"):
    x = np.asarray(extra[key])
    x = x[:, x.shape[1] - width:] if x.shape[1] >= width else np.pad(
      x, [(0, 0), (width - x.shape[1], 0)])
    out[key][used] = x[used]
  return out


def _mixed(rewards: np.ndarray) -> np.ndarray:
  """`bool [B]`: a group's valid rewards are not all equal."""
  hi = np.nanmax(np.where(np.isfinite(rewards), rewards, -np.inf), axis=1)
  lo = np.nanmin(np.where(np.isfinite(rewards), rewards, np.inf), axis=1)
  return hi - lo > 1e-6


def build_interventions(config):
  """The configured RAIL part (`config.intervention.mode`), or None (no section, or "none")."""
  knobs = config.get("intervention")
  if knobs is None or knobs.mode == "none":
    return None
  return Interventions(config)
