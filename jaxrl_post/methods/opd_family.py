"""The on-policy distillation family as one method on the loop, picked by `config.distill.method`.

  name              advantage (token level unless said)                         paper
  "grpo"            Â = group-normalised verifier reward (no teacher)            2402.03300
  "opd"             d_t = lp_T − lp_old (sampled-token reverse-KL reward)         2306.13649
  "tv_opd"          c_k·sign(d_t), c_k from the TV estimate; or an Eq. 7          2609.08341
                    ablation (`distill.tv_variant` raw / sign / group_constant /
                    permuted)
  "opd_then_rl"     d_t for steps ≤ S, Â afterwards; S fixed or "auto"            2609.04108
  "joint:<name>"    a Table 1 joint baseline (kdrl, kdrl_mask, srpo, hdpo, trrd,   2609.04108
                    rlsd, kdrl_annealing): `losses.joint_opd_advantages`
  "tgopd"           per prompt: d_t if the teacher's probes pass, else GRPO        2609.02998
  "opdvr"           d_t clamped to the sign the verifier allows                    2608.24696
  "opdvr_inverse"   the inverse-gate ablation of OPDVR                             2608.24696
  "grpd"            OPDVR × |group advantage of correctness| + u                   2608.24696
  "oprd"            Â (no std), gradient amplified along the teacher shift         2609.08798
                    (`losses.oprd_transform` inside the chunked scorer)

One step (`OPDFamily.step`):

  1. `prompts_per_step` prompts from the task's train split (sharded loader, as GRPO);
  2. `group_size` student rollouts each (the sampler's mesh); TGOPD also samples
     `distill.probes` teacher rollouts per prompt with the same sampler;
  3. the verifier rewards them (`rewards.verifiers.rewards_for`); Â from `config.advantage`;
  4. the trainer scores the old student and the frozen teacher on the sampled tokens (OPRD:
     also the student's top-K, and teacher and teacher reference on "sampled ∪ top-K");
  5. advantages from the chosen pure function of `jaxrl_post.losses`;
  6. `ppo_epochs × ppo_mini_batches` updates (`training.ppo.ppo_phase`) of the PPO-clipped
     loss (`training.objectives.make_policy_loss`; TRRD's modulated ratio through the batch's
     `logp_scale`, OPRD's correction through its `logits_transform`).

The method's own state (`state_dict`): the data position, TV-OPD's scheduler state (advanced
only when every update of the step had a finite loss and gradient, `losses.tv_opd_commit`),
and OPD-then-RL's evaluation history and switch step.

The teacher (`config.distill.teacher`) and OPRD's teacher reference (`distill.teacher_ref`)
are checkpoint directories like Open-MOPD's teachers (an orbax run of this codebase or a
Hugging Face directory) and must share the student's architecture and vocabulary.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxrl_post import losses
from jaxrl_post.losses import joint_opd as joint_lib
from jaxrl_post.methods.grpo import (
  ROLLOUT_KEYS,
  global_records,
  policy_objective,
  policy_runtime,
  sample_groups,
  step_record,
  task_loader,
  verify_groups,
)
from jaxrl_post.methods.opd import load_teachers
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import FINISH_EOS
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import StartPoint, resolve_start

GATED = tuple(losses.GATED_OPD_ADVANTAGES.names())
BASE_METHODS = ("grpo", "opd", "tv_opd", "opd_then_rl", "oprd", *GATED)
JOINT_PREFIX = "joint:"
TV_VARIANTS = ("tv", *losses.TV_OPD_ADVANTAGES.names())
OPRD_KEYS = ("oprd_ids", "oprd_direction", "oprd_slot_mask", "oprd_lam_pos", "oprd_lam_neg")


def method_names() -> list[str]:
  """Every valid `config.distill.method`."""
  return [*BASE_METHODS, *(JOINT_PREFIX + b for b in losses.JOINT_OPD_BASELINES.names())]


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """A parsed `config.distill.method`.

  Attributes:
    kind: "grpo", "opd", "tv_opd", "opd_then_rl", "joint", "gated" or "oprd".
    name: the canonical name ("joint:kdrl_mask", "opdvr", ...).
    baseline: the joint baseline or gated method ('' otherwise).
    needs_teacher, needs_teacher_ref: which frozen models it scores.
  """

  kind: str
  name: str
  baseline: str = ""
  needs_teacher: bool = True
  needs_teacher_ref: bool = False


def parse_method(name: str) -> MethodSpec:
  """`config.distill.method` → `MethodSpec`.

  Joint baselines are `joint:<name>` ("joint:KDRL-mask" works: case and '-' do not matter).

  Raises:
    ValueError: an unknown method or baseline, listing the known ones.

  Examples:
    >>> parse_method("joint:KDRL-mask").name
    'joint:kdrl_mask'
    >>> parse_method("grpo").needs_teacher
    False
  """
  key = str(name).strip().lower()
  if key.startswith(JOINT_PREFIX):
    baseline = key[len(JOINT_PREFIX):].replace("-", "_")
    if baseline not in losses.JOINT_OPD_BASELINES:
      raise ValueError(f"config.distill.method={name!r}: unknown joint OPD baseline "
                       f"{baseline!r}; known: "
                       f"{', '.join(losses.JOINT_OPD_BASELINES.names())}")
    return MethodSpec("joint", JOINT_PREFIX + baseline, baseline)
  key = key.replace("-", "_")
  if key == "grpo":
    return MethodSpec("grpo", key, needs_teacher=False)
  if key in ("opd", "tv_opd", "opd_then_rl"):
    return MethodSpec(key, key)
  if key == "oprd":
    return MethodSpec("oprd", key, needs_teacher_ref=True)
  if key in GATED:
    return MethodSpec("gated", key, key)
  raise ValueError(f"config.distill.method={name!r} is unknown; known: "
                   f"{', '.join(method_names())}")


def parse_switch_step(value: Any) -> int | None:
  """`config.distill.switch_step`: an int S ≥ 0, or "auto" (None: `auto_switch_step`).

  Examples:
    >>> parse_switch_step("60"), parse_switch_step("auto")
    (60, None)
  """
  text = str(value).strip().lower()
  if text == "auto":
    return None
  try:
    step = int(text)
  except ValueError:
    raise ValueError(f"config.distill.switch_step={value!r} must be an int >= 0 or 'auto'"
                     ) from None
  if step < 0:
    raise ValueError(f"config.distill.switch_step={value!r} must be an int >= 0 or 'auto'")
  return step


def _keyword_names(fn) -> tuple[str, ...]:
  params = inspect.signature(fn).parameters.values()
  return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


# Inputs the method passes to a gated advantage itself (not settings).
_GATED_DATA = ("rewards", "group_ids", "probe_rewards", "num_groups")


def check_knobs(spec: MethodSpec, knobs: Mapping[str, Any]) -> None:
  """Rejects a `config.distill.knobs` entry the chosen method does not take (naming its own).

  Joint baselines take `beta`, `alpha`, `lam`, `epsilon`, `correct_reward`, `beta_start`,
  `beta_end` (each its own); gated methods their keyword settings (`tau`, `grpo_std`,
  `threshold`, `norm_std`, `scale_baseline`, ...). Other methods take none.
  """
  if spec.kind == "joint":
    fn, data = losses.JOINT_OPD_BASELINES.get(spec.baseline), joint_lib.DATA_KNOBS
  elif spec.kind == "gated":
    fn, data = losses.GATED_OPD_ADVANTAGES.get(spec.baseline), _GATED_DATA
  else:
    fn, data = None, ()
  accepted = () if fn is None else tuple(k for k in _keyword_names(fn) if k not in data)
  if spec.baseline == "opdvr_inverse":  # **kwargs forwarded to opdvr_advantages
    accepted = ("threshold",)
  unknown = sorted(set(knobs) - set(accepted))
  if unknown:
    raise ValueError(f"config.distill.knobs: method {spec.name!r} has no setting(s) {unknown}; "
                     f"its settings: {', '.join(accepted) or 'none'}")


def validate_distill(config) -> MethodSpec:
  """Checks `config.distill` against the chosen method (before anything is built).

  Raises:
    ValueError: an unknown method / baseline / TV variant, a method that needs a teacher (or
      OPRD's teacher reference) given none, a bad switch step, knob or probe count.
  """
  distill = config.distill
  spec = parse_method(distill.method)
  if spec.needs_teacher and not distill.get("teacher"):
    raise ValueError(f"config.distill.method={spec.name!r} needs a teacher: set "
                     "config.distill.teacher=<checkpoint dir> (an orbax run or a Hugging Face "
                     "directory with the student's vocabulary)")
  if spec.needs_teacher_ref and not distill.get("teacher_ref"):
    raise ValueError(f"config.distill.method={spec.name!r} needs the teacher's pre-RL "
                     "reference: set config.distill.teacher_ref=<checkpoint dir>")
  if distill.tv_variant not in TV_VARIANTS:
    raise ValueError(f"config.distill.tv_variant={distill.tv_variant!r} is unknown; known: "
                     f"{', '.join(TV_VARIANTS)}")
  parse_switch_step(distill.switch_step)
  if spec.baseline == "tgopd" and distill.probes < 1:
    raise ValueError(f"config.distill.probes={distill.probes} must be >= 1 for tgopd")
  if spec.kind == "oprd" and distill.oprd_top_k < 1:
    raise ValueError(f"config.distill.oprd_top_k={distill.oprd_top_k} must be >= 1")
  check_knobs(spec, dict(distill.knobs))
  return spec


def _read_json(path: Path) -> dict[str, Any] | None:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def check_teacher_vocabulary(start: StartPoint, *, what: str, vocab_size: int,
                             tokenizer: str) -> None:
  """Fails early when a teacher's vocabulary is not the student's.

  A Hugging Face teacher's `config.json` gives its `vocab_size`; a run of this codebase has the
  run's `config.json` (tokenizer name, `model_overrides.vocab_size`) next to its checkpoints.
  Anything these files do not say is caught when the parameters load (`opd.load_teachers`
  compares every parameter shape with the student's).

  Raises:
    ValueError: naming `what` (the config key), both vocabularies and the path.
  """
  path = Path(start.path)
  if start.kind == "init_from_hf":
    cfg = _read_json(path / "config.json") or {}
    if cfg.get("vocab_size") is not None and int(cfg["vocab_size"]) != vocab_size:
      raise ValueError(f"{what}={str(path)!r} has a vocabulary of {cfg['vocab_size']} ids; the "
                       f"student's has {vocab_size}: teacher and student must share one "
                       "tokenizer")
    return
  for directory in (path, path.parent):
    cfg = _read_json(directory / "config.json")
    if cfg is None:
      continue
    theirs = cfg.get("tokenizer")
    if theirs and theirs != tokenizer:
      raise ValueError(f"{what}={str(path)!r} was trained with tokenizer {theirs!r}; the "
                       f"student uses {tokenizer!r}: teacher and student must share one "
                       "tokenizer")
    overrides = cfg.get("model_overrides") or {}
    if overrides.get("vocab_size") is not None and int(overrides["vocab_size"]) != vocab_size:
      raise ValueError(f"{what}={str(path)!r} has a vocabulary of {overrides['vocab_size']} "
                       f"ids; the student's has {vocab_size}")
    return


def locate_teacher(path: str, what: str) -> StartPoint:
  """The checkpoint in `path` (no loading), or a FileNotFoundError naming the config key."""
  try:
    return resolve_start(Path("/nonexistent"), init_from=path)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{what}={path!r}: {e}") from None


def tv_state_to_dict(state: losses.TVOPDState) -> dict[str, Any]:
  host = jax.device_get(state)
  return {"D_bar": float(host.D_bar), "D_ref": float(host.D_ref), "c": float(host.c),
          "initialized": bool(host.initialized)}


def tv_state_from_dict(d: Mapping[str, Any]) -> losses.TVOPDState:
  return losses.TVOPDState(D_bar=jnp.float32(d["D_bar"]), D_ref=jnp.float32(d["D_ref"]),
                           c=jnp.float32(d["c"]), initialized=jnp.bool_(d["initialized"]))


def oprd_chunk_transform(logits, mask, inputs):
  """OPRD's correction on one chunk of logits (`sampling.score_hidden`'s `logits_transform`)."""
  return losses.oprd_transform(logits, inputs["oprd_ids"], inputs["oprd_direction"],
                               inputs["oprd_slot_mask"], inputs["oprd_lam_pos"],
                               inputs["oprd_lam_neg"], mask)


def _masked_mean(x, mask) -> float:
  x, mask = np.asarray(x, np.float64), np.asarray(mask, bool)
  return float(x[mask].mean()) if mask.any() else 0.0


class OPDFamily:
  """The OPD family on `config.task` (configs/opd_family.py); a `training.loop.Method`."""

  def __init__(self, config):
    self.config = config
    self.spec = validate_distill(config)
    self.name = f"opd_family:{self.spec.name}"
    self.updates_per_step = config.ppo_epochs * config.ppo_mini_batches
    self.fixed_switch = parse_switch_step(config.distill.switch_step)
    self.data_iter = None
    self.tv_state = losses.init_tv_opd_state()
    self.tv_proposed = None
    self.shuffle_rng = jax.random.key(config.seed + 3)
    self.eval_history: list[tuple[int, float]] = []
    self.switch_step = self._switch_from_history()

  # ---- set-up ----

  def build_model(self, run: loop.Run):
    config, spec = self.config, self.spec
    self.task, self.tokenizer, _, model = run_setup.build_run(
      config, str(run.workdir), run.train_mesh, run.train_rules)
    oprd = dict(logits_transform=oprd_chunk_transform, transform_keys=OPRD_KEYS)
    self.objective = policy_objective(config, **(oprd if spec.kind == "oprd" else {}))
    self.loss_fn = self.objective.loss_fn
    # Teachers are located and their vocabularies checked here, before anything compiles.
    self.teacher_starts = {}
    wanted = ([("teacher", config.distill.teacher)] if spec.needs_teacher else []) + (
      [("teacher_ref", config.distill.teacher_ref)] if spec.needs_teacher_ref else [])
    for key, path in wanted:
      what = f"config.distill.{key}"
      start = locate_teacher(path, what)
      check_teacher_vocabulary(start, what=what, vocab_size=model.config.vocab_size,
                               tokenizer=config.tokenizer)
      self.teacher_starts[key] = start
    self.model = model
    return model

  def start(self, run: loop.Run, state) -> None:
    config, placement = self.config, run.placement
    self.run = run
    self.runtime = policy_runtime(run, config, self.model, self.tokenizer, self.task,
                                  self.loss_fn)
    self.step_fn, self.sampler, self.scorer, self.evaluator = self.runtime
    # Frozen teachers in the trainer's layout (restored into the born-sharded student state).
    self.frozen = {}
    for key, start in self.teacher_starts.items():
      try:
        (self.frozen[key],) = load_teachers([start], state, mesh=run.train_mesh,
                                            rules=run.train_rules)
      except ValueError as e:
        raise ValueError(f"config.distill.{key}: {e}") from None
    logging.info("%s: frozen models %s", self.name,
                 {k: str(s.path) for k, s in self.teacher_starts.items()})
    self.data_iter = iter(task_loader(config, self.task, config.prompts_per_step))
    self.probe_params = None
    if self.spec.baseline == "tgopd":  # the teacher samples its probes with the sampler
      self.probe_params = reshard_state(self.frozen["teacher"], placement.sample_mesh,
                                        placement.sample_rules)[0]
    self.rng = jax.random.key(config.seed + 1)
    self.probe_rng = jax.random.key(config.seed + 2)
    self.shuffle_rng = jax.random.key(config.seed + 3)

  # ---- the method's own state ----

  def _switch_from_history(self) -> int:
    if self.fixed_switch is not None:
      return self.fixed_switch
    switch = self.config.distill.switch
    return losses.auto_switch_step(self.eval_history, total_steps=self.config.steps,
                                   window=switch.window, delta=switch.delta,
                                   budget_fraction=switch.budget_fraction)

  def state_dict(self) -> dict[str, Any]:
    return {"data": self.data_iter.get_state(), "tv": tv_state_to_dict(self.tv_state),
            "eval_history": [[int(s), float(v)] for s, v in self.eval_history],
            "switch_step": int(self.switch_step)}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if "data" in state and self.data_iter is not None:
      self.data_iter.set_state(state["data"])
    if "tv" in state:
      self.tv_state = tv_state_from_dict(state["tv"])
    self.eval_history = [(int(s), float(v)) for s, v in state.get("eval_history", [])]
    # A fixed S is the config's; "auto" continues from the saved history's.
    self.switch_step = (self.fixed_switch if self.fixed_switch is not None else
                        int(state.get("switch_step", self._switch_from_history())))

  # ---- one step ----

  def put(self, tree):
    return put_batch(tree, self.run.train_mesh, self.run.train_rules)

  def score(self, params, inputs, **kwargs):
    return self.scorer.score(params, *(inputs[k] for k in ROLLOUT_KEYS),
                             temperature=self.config.temperature,
                             num_micro_batches=self.config.score_micro_batches, **kwargs)

  def probe_rewards(self, records, step: int) -> np.ndarray:
    """TGOPD: `[prompts, K_T]` verifier rewards of the teacher's own samples."""
    config = self.config
    k = config.distill.probes
    probes = self.sampler.generate(
      self.probe_params, [r["prompt"] for r in records], n_samples_per_prompt=k,
      max_new_tokens=config.max_new_tokens, temperature=config.distill.probe_temperature,
      top_k=config.top_k, top_p=config.top_p, rng=jax.random.fold_in(self.probe_rng, step))
    correct, _, _ = rewards_for(self.task, records, self.sampler.decode_text(probes), k,
                                timeout_s=config.reward_timeout_s)
    return np.asarray(correct, np.float32).reshape(len(records), k)

  def advantages(self, step: int, batch: Mapping[str, np.ndarray], seq_adv: np.ndarray,
                 correct: np.ndarray, group_ids: np.ndarray, num_groups: int,
                 records, extra: dict[str, Any]) -> tuple[np.ndarray, dict[str, float]]:
    """The step's `adv` (`[B]` or `[B, T]`) for the chosen method, and its metrics; adds
    method-specific loss inputs (TRRD's `old_logp` / `logp_scale`) to `extra`."""
    spec, distill = self.spec, self.config.distill
    knobs = dict(distill.knobs)
    mask = batch["completion_mask"]
    old, teacher = batch["old_logp"], batch.get("teacher_logp")
    metrics: dict[str, float] = {}
    if teacher is not None:
      gap = np.asarray(teacher, np.float64) - np.asarray(old, np.float64)
      metrics["distill/teacher_gap_mean"] = _masked_mean(gap, mask)
    if spec.kind in ("grpo", "oprd"):
      return seq_adv, metrics
    if spec.kind == "opd":
      return np.asarray(losses.sampled_token_opd_reward(old, teacher, mask)), metrics
    if spec.kind == "tv_opd":
      stats = losses.tv_estimate(teacher, old, mask)
      metrics["distill/tv_estimate"] = float(stats.mean())
      if distill.tv_variant == "tv":
        tv = distill.tv
        metrics["distill/tv_coef"] = float(self.tv_state.c)
        adv, self.tv_proposed = losses.tv_opd_advantages(
          teacher, old, mask, self.tv_state, alpha=tv.alpha, beta=tv.beta, c_min=tv.c_min,
          eps=tv.eps, stats=stats)
        return np.asarray(adv), metrics
      fn = losses.TV_OPD_ADVANTAGES.get(distill.tv_variant)
      return np.asarray(fn(teacher, old, mask, key=jax.random.fold_in(self.shuffle_rng, step))
                        ), metrics
    eos = None
    if distill.mask_final_eos:
      eos = losses.final_eos_mask(mask, extra.pop("ends_with_eos"))
    extra.pop("ends_with_eos", None)
    if spec.kind == "opd_then_rl":
      metrics["distill/switch_step"] = float(self.switch_step)
      metrics["distill/opd_phase"] = float(step <= self.switch_step)
      adv = losses.opd_then_rl_advantages(step, seq_adv, teacher, old, mask,
                                          switch_step=self.switch_step, eos_mask=eos)
      return np.asarray(adv), metrics
    if spec.kind == "joint":
      terms = losses.joint_opd_advantages(
        spec.baseline, seq_adv, teacher, old, np.nan_to_num(correct), mask, eos_mask=eos,
        group_ids=group_ids, num_groups=num_groups, step=step, total_steps=self.config.steps,
        **knobs)
      extra.update(old_logp=np.asarray(terms.old_logp), logp_scale=np.asarray(terms.logp_scale))
      return np.asarray(terms.adv), metrics
    # Gated: tgopd, opdvr, opdvr_inverse, grpd.
    data: dict[str, Any] = {"rewards": correct}
    if spec.baseline == "tgopd":
      probes = self.probe_rewards(records, step)
      gate = losses.teacher_gate(probes, tau=knobs.get("tau", 2.0 / 3.0))
      metrics["distill/gate_open_frac"] = float(np.mean(gate.gate))
      metrics["distill/teacher_pass_rate"] = float(np.nanmean(probes))
      data.update(group_ids=group_ids, probe_rewards=probes)
    elif spec.baseline == "grpd":
      data.update(group_ids=group_ids, num_groups=num_groups)
    adv = losses.gated_opd_advantages(spec.baseline, teacher, old, mask, **data, **knobs)
    return np.asarray(adv), metrics

  def oprd_inputs(self, step: int, inputs, batch, topk_ids) -> dict[str, np.ndarray]:
    """OPRD's per-position support, direction and λ for the loss's `logits_transform`."""
    distill = self.config.distill
    mask = batch["completion_mask"]
    ids, slot_mask = losses.oprd_support(batch["completion_tokens"], topk_ids, mask)
    ids, slot_mask = np.asarray(ids), np.asarray(slot_mask)
    placed = self.put(ids)
    teacher = self.score(self.frozen["teacher"], inputs, candidate_ids=placed).candidate_logp
    ref = self.score(self.frozen["teacher_ref"], inputs, candidate_ids=placed).candidate_logp
    direction = losses.oprd_direction(multihost.to_host(teacher), multihost.to_host(ref),
                                      slot_mask)
    # λ at the phase's first optimizer update k = (step − 1)·updates_per_step (Eq. 2.8).
    lam = losses.oprd_lambda((step - 1) * self.updates_per_step, lam=distill.oprd_lambda,
                             warmup_steps=distill.oprd_warmup_steps)
    shape = mask.shape
    return dict(oprd_ids=ids, oprd_direction=np.asarray(direction, np.float32),
                oprd_slot_mask=slot_mask,
                oprd_lam_pos=np.full(shape, float(lam.lam_pos), np.float32),
                oprd_lam_neg=np.full(shape, float(lam.lam_neg), np.float32))

  @staticmethod
  def oprd_alignment(batch, old) -> dict[str, float]:
    """OPRD's first-order diagnostics at the rollout policy (`losses.oprd_alignment`): the share
    of corrected tokens whose gradient points along the teacher shift, and the correction's
    size relative to the gradient. The backward pass itself logs nothing."""
    support_logp = np.concatenate([np.asarray(multihost.to_host(old.logp))[..., None],
                                   np.asarray(multihost.to_host(old.topk_logp))], axis=-1)
    mask = batch["completion_mask"]
    alignment = losses.oprd_alignment(
      batch["oprd_direction"], support_logp, batch["oprd_slot_mask"], batch["adv"],
      batch["oprd_lam_pos"], batch["oprd_lam_neg"], mask)
    return losses.oprd_alignment_metrics(alignment, mask)

  def commit_tv(self, updates: Sequence[Mapping[str, Any]]) -> None:
    """TV-OPD: keeps the step's proposed scheduler state only if every update of the phase
    had a finite loss and gradient norm (`skipped` = 0); a skipped step leaves it as it was."""
    if self.tv_proposed is not None:
      finite = all(int(u["skipped"]) == 0 for u in updates)
      self.tv_state = losses.tv_opd_commit(self.tv_state, self.tv_proposed, finite)
    self.tv_proposed = None

  def step(self, state, step: int):
    config, spec = self.config, self.spec
    timings: dict[str, float] = {}
    records = global_records(self.data_iter)
    # 1-2. Rollouts with the sampler's copy of the policy.
    rollout = sample_groups(self.runtime, state.params, [r["prompt"] for r in records], config,
                            jax.random.fold_in(self.rng, step), timings)

    # 3. Verifier rewards and the GRPO advantage Â.
    verified = verify_groups(self.objective, self.task, records,
                             self.sampler.decode_text(rollout), rollout.group_ids, config)

    # 4. Scores on the trainer's mesh: the old student, the teacher (and OPRD's reference).
    tic = time.perf_counter()
    host = multihost.to_host(dict({k: getattr(rollout, k) for k in ROLLOUT_KEYS},
                                  finish_reason=rollout.finish_reason,
                                  group_ids=rollout.group_ids, adv=verified.adv))
    batch = ppo.trim_completions({k: host[k] for k in ROLLOUT_KEYS},
                                 config.trim_completions_to)
    inputs = self.put(batch)
    old = self.score(state.params, inputs,
                     top_k=config.distill.oprd_top_k if spec.kind == "oprd" else 0)
    batch["old_logp"] = np.asarray(multihost.to_host(old.logp), np.float32)
    timings["time/score"] = time.perf_counter() - tic
    extra: dict[str, Any] = {"ends_with_eos": host["finish_reason"] == FINISH_EOS}
    if "teacher" in self.frozen:
      tic = time.perf_counter()
      batch["teacher_logp"] = np.asarray(
        multihost.to_host(self.score(self.frozen["teacher"], inputs).logp), np.float32)
      if spec.kind == "oprd":
        extra.update(self.oprd_inputs(step, inputs, batch, multihost.to_host(old.topk_ids)))
      timings["time/teacher"] = time.perf_counter() - tic

    # 5. Advantages.
    tic = time.perf_counter()
    self.tv_proposed = None
    adv, distill_metrics = self.advantages(
      step, batch, host["adv"], np.asarray(verified.correct, np.float32), host["group_ids"],
      len(records), records, extra)
    extra.pop("ends_with_eos", None)
    batch.pop("teacher_logp", None)
    batch.update(extra, adv=np.asarray(adv, np.float32))
    timings["time/advantages"] = time.perf_counter() - tic

    # 6. The PPO phase; TV-OPD's scheduler advances only if every update was finite.
    tic = time.perf_counter()
    state, updates = ppo.ppo_phase(
      self.step_fn, state, batch, epochs=config.ppo_epochs, mini_batches=config.ppo_mini_batches,
      rng=np.random.default_rng([config.seed, step]), put=self.put)
    timings["time/update"] = time.perf_counter() - tic
    self.commit_tv(updates)

    record = step_record(updates, rollout, old.logp, verified, batch["completion_mask"], timings)
    record.update(distill_metrics)
    if spec.kind == "oprd":
      record.update(self.oprd_alignment(batch, old))
    mask, adv = batch["completion_mask"], np.asarray(adv)
    record["distill/adv_abs_mean"] = _masked_mean(
      np.abs(adv if adv.ndim == 2 else adv[:, None] * np.ones_like(mask)), mask)
    return state, record

  # ---- evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, float]:
    record = self.evaluator(state.params, step)
    if (self.spec.kind == "opd_then_rl" and self.fixed_switch is None
        and step <= self.switch_step):
      # The auto switch's history: evaluations of the OPD phase only.
      self.eval_history.append((int(step), float(record["eval/accuracy"])))
      self.switch_step = self._switch_from_history()
      record["eval/switch_step"] = float(self.switch_step)
    return record

  def progress(self, record):
    return {"reward": record["train/reward_correct"], "tok_s": record["train/tokens_per_s"]}

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str:
    line = loop.eval_summary(records, "eval/accuracy", f"{self.spec.name}: held-out accuracy")
    if self.spec.kind == "opd_then_rl":
      line += f" (OPD for steps 1..{self.switch_step}, then RL)"
    return line
