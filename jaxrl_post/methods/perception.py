"""Autoregressive dense detection: SFT by teacher forcing, then GRPO with a set-level count reward.

Falcon Perception-HD (arXiv 2608.18881) on `jaxrl_post.tasks.dense_scenes` with
`models.perception.PerceptionDetector`. One run is one phase (`config.phase`):

  sft       teacher forcing on the canonical (raster) instance order, all three heads
            (`losses.perception.detection_sft_loss`);
  rl        one step: `prompts_per_step` positive queries → G rollouts each from the detector's
            decode loop (`sampling.detection.DetectionSampler`: LM and coord heads sampled at
            `rl.temperature`, size head greedy) → chains decoded to boxes (malformed ones counted)
            → r = −(FN + α·FP) by exact Hungarian matching at IoU > τ
            (`rewards.set_matching.count_rewards`) → population-std group advantages → one update
            of the Dr.GRPO / engine-mismatch-IS / Clip-Cov loss
            (`losses.perception.detection_grpo_loss`);
  sft_more  the longer-SFT control (SFT continued from `init_from`).

The data of step s are the scenes `s·batch … (s+1)·batch − 1` of the task's seeded generator
(offset per phase so that no phase sees another's scenes), the same on every process, so a
resumed run sees what it would have and there is no data position to checkpoint.

Evaluation (greedy) on two fixed test sets: `dense` ("anything" queries, counts spread over the
buckets 0, 1–10, 11–50, 51–200, 201–500; F1 by bucket, with and without NMS, redundancy) and
`ref` (in-distribution colour/shape queries with negatives; F1 and presence MCC).

Deviations from the paper (docs/results.md, "Falcon Perception-HD"): there is no mask head — a
chain is `<coord>(x,y) <size>(w,h)` per instance with no `<seg>` step, so every F1 is box F1 at
IoU 0.5, where the paper reports mask F1 (its seg head is frozen in RL and carries no
policy-gradient term, so the RL loss has the same terms). The optimizer is `config.optimizer`:
AdamW in the reported runs; the paper's Muon + Lion split with `optimizer=paper`
(configs/perception_dense.py, `training.optimizers`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from jaxrl_post import advantages as advantages_lib
from jaxrl_post.losses.perception import (
  categorical_entropy,
  detection_grpo_loss,
  detection_sft_loss,
)
from jaxrl_post.models import get_model_config
from jaxrl_post.models.perception import Chain, PerceptionConfig, PerceptionDetector
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import init_sharded, put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.rewards import set_matching
from jaxrl_post.sampling import detection
from jaxrl_post.sampling.detection import BinSpec, DecodeStats
from jaxrl_post.tasks import dense_scenes as ds
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.train_state import make_train_step

PHASES = ("sft", "rl", "sft_more")
# Scene-index offsets of the phases' training streams: sft_more continues after SFT's scenes and
# RL reads its own, so no scene is seen by two phases.
DATA_OFFSETS = {"sft": 0, "sft_more": 10**6, "rl": 2 * 10**6}


# ---------------------------------------------------------------------------------------------
# Losses on the model (the forward pass; the maths is in losses.perception)
# ---------------------------------------------------------------------------------------------


def _chain(batch) -> Chain:
  return Chain(*jnp.moveaxis(batch["chain"], 1, 0))


def sft_loss(model: PerceptionDetector, batch) -> tuple[jax.Array, dict]:
  """Teacher-forced NLL of the three heads (`detection_sft_loss`) for `make_train_step`.

  `batch`: `images [b,S,S,C]`, `queries [b,Q]`, `chain [b,5,T]` (token, x, y, w, h), `mask [b,T]`,
  `num_tokens []` (the whole batch's valid actions).
  """
  chain = _chain(batch)
  logits = model(batch["images"], batch["queries"], chain)
  lp = detection.chain_logprobs(logits, chain, batch["mask"])
  return detection_sft_loss(lp, batch["mask"], batch["num_tokens"])


def grpo_loss(model: PerceptionDetector, batch, *, temperature: float = 1.0, max_tokens: int,
              clip_cov_seed: int = 0, detach_existence: bool = True, **loss_kwargs
              ) -> tuple[jax.Array, dict]:
  """The count-reward GRPO loss (`detection_grpo_loss`) on the detector, for `make_train_step`.

  `batch`: `images`, `queries`, `chain [B,5,T]`, `mask [B,T]`, `adv [B]`, `rollout_logp [B,T]`
  (the sampler's LM + coord log-probs of the actions, at `temperature`), `num_sequences []` (B),
  `clip_cov_step []` (Clip-Cov's key is `fold_in(key(clip_cov_seed), clip_cov_step)`).
  `loss_kwargs`: `clip_cov`, `clip_cov_ratio`, `clip_cov_lm`, `clip_cov_coord`, `is_max`.

  All of `GRPOAux` is returned as metrics: the method runs the update as one micro-batch (the
  means and Clip-Cov's pick are over the call's own tokens), where the summed aux is the value.
  """
  chain, mask = _chain(batch), batch["mask"]
  logits = model(batch["images"], batch["queries"], chain)
  lp = detection.chain_logprobs(logits, chain, mask, temperature=temperature,
                                detach_existence=detach_existence)
  key = jax.random.fold_in(jax.random.key(clip_cov_seed), batch["clip_cov_step"])
  loss, aux = detection_grpo_loss(
    lp, mask=mask, coord_actions=(mask > 0) & (chain.tokens == ds.COORD), adv=batch["adv"],
    rollout_logp=batch["rollout_logp"], num_sequences=batch["num_sequences"],
    max_tokens=max_tokens, key=key,
    coord_entropy=(categorical_entropy(logits.x, temperature)
                   + categorical_entropy(logits.y, temperature)), **loss_kwargs)
  return loss, aux._asdict()


def sft_batch(scenes: Sequence[ds.Scene], bins: BinSpec, max_instances: int) -> dict:
  """Host batch for `sft_loss`: the scenes' canonical chains (`detection.encode_chain`)."""
  enc = [detection.encode_chain(s.boxes, bins, max_instances) for s in scenes]
  mask = np.stack([e[1] for e in enc])
  return dict(images=np.stack([s.image for s in scenes]),
              queries=np.stack([s.query.tokens for s in scenes]),
              chain=np.stack([e[0] for e in enc]), mask=mask,
              num_tokens=np.float32(mask.sum()))


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def bucket_name(lo: int, hi: int) -> str:
  return f"{lo}" if lo == hi else f"{lo}-{hi}"


def evaluate_predictions(preds: Sequence[np.ndarray], scenes: Sequence[ds.Scene],
                         stats: Sequence[DecodeStats], *,
                         buckets=ds.COUNT_BUCKETS) -> dict[str, float]:
  """Dense-perception metrics of decoded predictions (arXiv 2608.18881), raw and after NMS.

  * `f1@0.5` (PBench-dense protocol) and `f1` (mean over IoU 0.50:0.05:0.95): macro over the
    positive samples, overall and per count bucket (`f1@0.5/<bucket>`); `nms_*` the same after
    greedy NMS at IoU 0.5 in emission order.
  * `redundancy`: share of predictions NMS removes (MRR on boxes); `mcc`: presence MCC over all
    samples (positive and negative queries); `count_ratio`: Σ predicted / Σ ground truth;
    `malformed_rate`: malformed chains / samples; `truncated_rate`.
  """
  gts = [s.boxes for s in scenes]
  kept = [p[set_matching.nms(p)] if len(p) else p for p in preds]
  out = {}
  for name, ps in (("", preds), ("nms_", kept)):
    out[f"{name}f1@0.5"] = set_matching.macro_f1(ps, gts, thresholds=(0.5,))
    out[f"{name}f1"] = set_matching.macro_f1(ps, gts)
    counts = np.array([len(g) for g in gts])
    for lo, hi in buckets:
      idx = np.flatnonzero((counts >= lo) & (counts <= hi))
      if lo == 0 or idx.size == 0:
        continue
      out[f"{name}f1@0.5/{bucket_name(lo, hi)}"] = set_matching.macro_f1(
        [ps[i] for i in idx], [gts[i] for i in idx], thresholds=(0.5,))
  n_pred = sum(len(p) for p in preds)
  out["redundancy"] = (n_pred - sum(len(k) for k in kept)) / n_pred if n_pred else 0.0
  out["mcc"] = set_matching.presence_mcc(preds, gts)
  out["count_ratio"] = n_pred / max(sum(len(g) for g in gts), 1)
  total = detection.sum_stats(stats)
  out["malformed_rate"] = sum(s.malformed > 0 for s in stats) / max(len(stats), 1)
  out["truncated_rate"] = total.truncated / max(len(stats), 1)
  empty = [i for i, g in enumerate(gts) if len(g) == 0]
  if empty:
    out["negative_accuracy"] = float(np.mean([len(preds[i]) == 0 for i in empty]))
  return out


def predict(sample_fn, params, scenes: Sequence[ds.Scene], bins: BinSpec, *, batch_size: int,
            rng=None) -> tuple[list[np.ndarray], list[DecodeStats]]:
  """Runs `sample_fn` over `scenes` in fixed-size batches (the last padded) and decodes.

  `sample_fn`: `(params, images, queries, rng) -> DetectionRollout` (a `DetectionSampler`); its
  rollouts are fetched with `multihost.to_host` (whole on every process).
  """
  rng = jax.random.key(0) if rng is None else rng
  preds, stats = [], []
  for start in range(0, len(scenes), batch_size):
    chunk = list(scenes[start:start + batch_size])
    pad = batch_size - len(chunk)
    chunk_p = chunk + [chunk[-1]] * pad  # Fixed shapes: one compiled program.
    images = np.stack([s.image for s in chunk_p])
    queries = np.stack([s.query.tokens for s in chunk_p])
    rollout = multihost.to_host(sample_fn(params, images, queries,
                                          jax.random.fold_in(rng, start)))
    p, st = detection.decode_batch(rollout.chain, rollout.mask, bins)
    preds += p[:len(chunk)]
    stats += st[:len(chunk)]
  return preds, stats


# ---------------------------------------------------------------------------------------------
# The method
# ---------------------------------------------------------------------------------------------


class Perception:
  """Falcon Perception-HD's phases on dense scenes (configs/perception_dense.py); a
  `training.loop.Method`."""

  name = "perception"
  updates_per_step = 1

  def __init__(self, config):
    self.config = config
    self.name = f"perception/{config.phase}"

  def build_model(self, run: loop.Run) -> PerceptionDetector:
    config, rl_cfg = self.config, self.config.rl
    if config.phase not in PHASES:
      raise ValueError(f"config.phase={config.phase!r}; valid: {', '.join(PHASES)}")
    if config.size_bins < config.task.max_size:
      raise ValueError(f"config.size_bins ({config.size_bins}) < config.task.max_size "
                       f"({config.task.max_size}): some object sizes would not be representable")
    if config.coord_bins < 2 * config.image_size:
      logging.warning("config.coord_bins=%d < 2·image_size: centres are not exactly "
                      "representable", config.coord_bins)
    if config.phase == "rl":
      set_matching.SET_REWARDS.get(rl_cfg.reward)  # Raises with the valid names.
      if rl_cfg.group_size < 2:
        raise ValueError(f"config.rl.group_size={rl_cfg.group_size}: GRPO needs ≥ 2 rollouts")
    if config.phase in ("rl", "sft_more") and run.start.kind == "scratch":
      raise ValueError(f"phase={config.phase} starts from an SFT run: set config.init_from")

    self.task = ds.DenseSceneTask(seed=config.seed, image_size=config.image_size,
                                  max_size=config.task.max_size,
                                  count_buckets=tuple(tuple(b) for b in config.task.count_buckets),
                                  bucket_weights=tuple(config.task.bucket_weights),
                                  negative_prob=config.task.negative_prob,
                                  max_distractors=config.task.max_distractors)
    lm_config = get_model_config(config.model, vocab_size=ds.VOCAB_SIZE,
                                 **dict(config.model_overrides))
    pconfig = PerceptionConfig(lm_config, image_size=config.image_size,
                               patch_size=config.patch_size, coord_bins=config.coord_bins,
                               size_bins=config.size_bins, coord_token=ds.COORD,
                               size_token=ds.SIZE,
                               fourier_features=config.get("fourier_features", 0),
                               pointer_head=config.get("pointer_head", False),
                               conv_stem=config.get("conv_stem", False))
    # Every parameter carries logical axes (models/perception.py), so it is created in its
    # shards on the trainer's mesh.
    self.model = init_sharded(lambda: PerceptionDetector(pconfig, rngs=nnx.Rngs(config.seed)),
                              run.train_mesh, run.train_rules)
    self.bins = BinSpec(config.coord_bins, config.size_bins, config.image_size)
    self.max_actions = detection.chain_length(config.max_instances)
    return self.model

  def start(self, run: loop.Run, state) -> None:
    config, rl_cfg, placement = self.config, self.config.rl, run.placement
    self.run = run
    if config.phase == "rl":
      loss_fn = lambda m, b: grpo_loss(  # noqa: E731
        m, b, temperature=rl_cfg.temperature, max_tokens=self.max_actions,
        clip_cov_seed=config.seed + 2, detach_existence=rl_cfg.detach_existence,
        clip_cov=rl_cfg.clip_cov, clip_cov_ratio=rl_cfg.clip_cov_ratio,
        clip_cov_lm=tuple(rl_cfg.clip_cov_lm), clip_cov_coord=tuple(rl_cfg.clip_cov_coord),
        is_max=None if rl_cfg.is_max <= 0 else rl_cfg.is_max)
      shared = ("num_sequences", "clip_cov_step")
    else:
      loss_fn, shared = sft_loss, ("num_tokens",)
    self.step_fn = make_train_step(run.graphdef, loss_fn, run.optimizer, mesh=run.train_mesh,
                                   rules=run.train_rules, shared=shared)
    # The decode loops run on the sampler's mesh (the trainer's devices unless
    # `config.mesh.sampler_devices` gives it its own), on its layout of the parameters.
    self.greedy = detection.DetectionSampler(
      run.graphdef, detection.chain_length(config.eval_max_instances), temperature=0.0,
      mesh=placement.sample_mesh, rules=placement.sample_rules)
    self.sampler = detection.DetectionSampler(
      run.graphdef, self.max_actions, temperature=rl_cfg.temperature,
      mesh=placement.sample_mesh, rules=placement.sample_rules)
    self.rng = jax.random.key(config.seed + 1)
    # Evaluation sets: fixed, seeded by config.seed.
    self.eval_sets = (
      ("dense", ds.count_eval_set(config.seed, config.eval_per_bucket,
                                  image_size=config.image_size, max_size=config.task.max_size)),
      ("ref", self.task.batch("test", range(config.eval_referring))))

  def state_dict(self) -> dict[str, Any]:
    return {}  # The step's data are a function of the step (module docstring).

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    del state

  def sampler_params(self, params):
    placement = self.run.placement
    return reshard_state(params, placement.sample_mesh, placement.sample_rules)

  def put(self, batch):
    return put_batch(batch, self.run.train_mesh, self.run.train_rules)

  def step(self, state, step: int):
    tic = time.perf_counter()
    if self.config.phase == "rl":
      state, record = self.rl_step(state, step)
    else:
      state, record = self.sft_step(state, step)
    record["time/step"] = time.perf_counter() - tic
    return state, record

  def sft_step(self, state, step: int):
    config = self.config
    offset = DATA_OFFSETS[config.phase] + (step - 1) * config.batch_size
    scenes = self.task.batch("train", range(offset, offset + config.batch_size))
    state, metrics = self.step_fn(state, self.put(sft_batch(scenes, self.bins,
                                                            config.max_instances)))
    return state, {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}

  def rl_step(self, state, step: int):
    rl_cfg = self.config.rl
    tic = time.perf_counter()
    p, g = rl_cfg.prompts_per_step, rl_cfg.group_size
    # Prompts: positive queries only (RL on a query with nothing to find teaches no boxes).
    offset = DATA_OFFSETS["rl"] + (step - 1) * p
    scenes = self.task.batch("train", range(offset, offset + p), positive=True)
    images = np.repeat(np.stack([s.image for s in scenes]), g, axis=0)
    queries = np.repeat(np.stack([s.query.tokens for s in scenes]), g, axis=0)
    # Rollout: G chains per prompt, fetched whole onto every process.
    params, reshard_s = self.sampler_params(state.params)
    rollout = multihost.to_host(self.sampler(params, images, queries,
                                             jax.random.fold_in(self.rng, step)))
    record = {"time/reshard": reshard_s, "time/generate": time.perf_counter() - tic}
    # Score: chains → boxes → set rewards against the ground truth.
    preds, stats = detection.decode_batch(rollout.chain, rollout.mask, self.bins)
    gts = [s.boxes for s in scenes for _ in range(g)]
    rewards = set_matching.count_rewards(preds, gts, kind=rl_cfg.reward,
                                         fp_weight=rl_cfg.fp_weight,
                                         iou_threshold=rl_cfg.iou_threshold)
    # Advantages: population std (ddof=0), as in the paper's Â = (r − μ_G) / (σ_G + ε).
    group_ids = jnp.asarray(np.repeat(np.arange(p), g))
    adv = advantages_lib.group_advantages(jnp.asarray(rewards), group_ids, num_groups=p, ddof=0,
                                          eps=rl_cfg.advantage_eps)
    # Update: on the padded width trimmed to the longest rollout (rounded up: a few compiled
    # widths); the Dr.GRPO denominator stays B·T_max with T_max the full decode budget.
    width = int(rollout.mask.sum(-1).max())
    width = min(self.max_actions, -(-width // rl_cfg.trim_to) * rl_cfg.trim_to)
    batch = dict(images=images, queries=queries,
                 chain=np.stack([a[:, :width] for a in rollout.chain], axis=1),
                 mask=rollout.mask[:, :width], rollout_logp=rollout.logp[:, :width],
                 adv=np.asarray(adv), num_sequences=np.float32(len(preds)),
                 clip_cov_step=np.int32(step))
    state, metrics = self.step_fn(state, self.put(batch))
    total = detection.sum_stats(stats)
    record.update({f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()})
    record.update({"train/reward": float(rewards.mean()),
                   "train/reward_std_in_group": float(rewards.reshape(p, g).std(1).mean()),
                   "train/pred_per_gt": sum(map(len, preds)) / max(sum(map(len, gts)), 1),
                   "train/malformed_rate": float(np.mean([s.malformed > 0 for s in stats])),
                   "train/truncated_rate": total.truncated / len(stats),
                   "train/actions": float(rollout.mask.sum(-1).mean())})
    return state, record

  def evaluate(self, state, step: int) -> dict[str, float]:
    tic = time.perf_counter()
    params, _ = self.sampler_params(state.params)
    record = {}
    for name, scenes in self.eval_sets:
      preds, stats = predict(self.greedy, params, scenes, self.bins,
                             batch_size=self.config.eval_batch_size)
      metrics = evaluate_predictions(preds, scenes, stats)
      record.update({f"eval/{name}/{k}": v for k, v in metrics.items()})
    record["time/eval"] = time.perf_counter() - tic
    logging.info("step %d eval: dense f1@0.5 %.3f (nms %.3f), redundancy %.3f, ref mcc %.3f",
                 step, record["eval/dense/f1@0.5"], record["eval/dense/nms_f1@0.5"],
                 record["eval/dense/redundancy"], record["eval/ref/mcc"])
    return record

  def progress(self, record):
    out = {"loss": record["train/loss"]}
    if "train/reward" in record:
      out["reward"] = record["train/reward"]
    return out

  def summary(self, records) -> str:
    evals = [r for r in records if "eval/dense/f1@0.5" in r]
    if not evals:
      return ""
    first, last = evals[0], evals[-1]
    return (f"dense F1@0.5 {first['eval/dense/f1@0.5']:.3f} at step {first['step']} → "
            f"{last['eval/dense/f1@0.5']:.3f} at step {last['step']}; referring MCC "
            f"{first['eval/ref/mcc']:.3f} → {last['eval/ref/mcc']:.3f}")
