r"""Autoregressive dense detection: SFT by teacher forcing, then GRPO with a set-level count reward.

  python experiments/perception.py --config=configs/perception_dense.py:phase=sft \
      --workdir=/tmp/perc/sft
  python experiments/perception.py --config=configs/perception_dense.py:phase=rl \
      --workdir=/tmp/perc/rl --config.init_from=/tmp/perc/sft

Falcon Perception-HD (arXiv 2608.18881) on `jaxrl_post.tasks.dense_scenes`. One run is one phase:

  sft       teacher forcing on the canonical (raster) instance order, all three heads;
  rl        per step: `prompts_per_step` positive queries × G rollouts (LM and coord heads
            sampled at `rl.temperature`, size head greedy) → decode chains (malformed ones
            counted) → r = −(FN + α·FP) by exact Hungarian matching at IoU > τ → population-std
            group advantages → one update of the Dr.GRPO / engine-mismatch-IS / Clip-Cov loss
            of `jaxrl_post.training.perception.grpo_loss`;
  sft_more  the longer-SFT control (SFT continued from `init_from`).

Evaluation (greedy) on two fixed test sets: `dense` ("anything" queries, counts spread over the
buckets 0, 1–10, 11–50, 51–200, 201–500; F1 by bucket, with and without NMS, redundancy) and
`ref` (in-distribution colour/shape queries with negatives; F1 and presence MCC).
Killed and restarted with the same command, a run resumes from its last checkpoint; the data
of step s are the scenes `s·batch … (s+1)·batch − 1`, so a resumed run sees what it would have.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from jaxrl_post import advantages as advantages_lib
from jaxrl_post.models import get_model_config
from jaxrl_post.models.perception import PerceptionConfig, PerceptionDetector
from jaxrl_post.rewards.set_matching import SET_REWARDS
from jaxrl_post.tasks import dense_scenes as ds
from jaxrl_post.training import perception as perc
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.metrics import MetricWriter, read_metrics
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  rl_cfg = config.rl

  # ---- Validate the config (before anything compiles) ----
  if config.phase not in ("sft", "rl", "sft_more"):
    raise ValueError(f"config.phase={config.phase!r}; valid: sft, rl, sft_more")
  if config.size_bins < config.task.max_size:
    raise ValueError(f"config.size_bins ({config.size_bins}) < config.task.max_size "
                     f"({config.task.max_size}): some object sizes would not be representable")
  if config.coord_bins < 2 * config.image_size:
    logging.warning("config.coord_bins=%d < 2·image_size: centres are not exactly representable",
                    config.coord_bins)
  if config.phase == "rl":
    SET_REWARDS.get(rl_cfg.reward)  # Raises with the valid names.
    if rl_cfg.group_size < 2:
      raise ValueError(f"config.rl.group_size={rl_cfg.group_size}: GRPO needs ≥ 2 rollouts")
  start = run_setup.start_point(config, workdir)
  if config.phase in ("rl", "sft_more") and start.kind == "scratch":
    raise ValueError(f"phase={config.phase} starts from an SFT run: set config.init_from")

  # ---- Task, model ----
  task = ds.DenseSceneTask(seed=config.seed, image_size=config.image_size,
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
  model = PerceptionDetector(pconfig, rngs=nnx.Rngs(config.seed))
  bins = perc.BinSpec(config.coord_bins, config.size_bins, config.image_size)
  num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  logging.info("start: %s; detector %.2fM parameters", start.kind, num_params / 1e6)

  # ---- Evaluation sets (fixed, seeded by config.seed) ----
  dense_eval = ds.count_eval_set(config.seed, config.eval_per_bucket,
                                 image_size=config.image_size, max_size=config.task.max_size)
  ref_eval = task.batch("test", range(config.eval_referring))

  # ---- Train state, update step, restore ----
  optimizer = run_setup.build_optimizer(config, config.steps)
  state = create_train_state(model, optimizer, jax.random.key(config.seed))
  graphdef = nnx.split(model)[0]
  max_actions = perc.chain_length(config.max_instances)
  if config.phase == "rl":
    loss_fn = lambda m, b: perc.grpo_loss(  # noqa: E731
      m, b, temperature=rl_cfg.temperature, max_tokens=max_actions,
      detach_existence=rl_cfg.detach_existence, clip_cov=rl_cfg.clip_cov,
      clip_cov_ratio=rl_cfg.clip_cov_ratio, clip_cov_lm=tuple(rl_cfg.clip_cov_lm),
      clip_cov_coord=tuple(rl_cfg.clip_cov_coord),
      is_max=None if rl_cfg.is_max <= 0 else rl_cfg.is_max)
    step_fn = make_train_step(graphdef, loss_fn, optimizer, shared=("num_sequences", "key"))
  else:
    step_fn = make_train_step(graphdef, perc.sft_loss, optimizer, shared=("num_tokens",))
  checkpointer = Checkpointer(run_setup.checkpoint_dir(workdir),
                              max_to_keep=config.keep_checkpoints)
  state, extra = run_setup.restore(start, checkpointer, state)
  first_step = int(extra.get("phase_step", 0))
  writer = MetricWriter(workdir, resume_step=first_step if start.kind == "workdir" else None)
  writer.write_config(config)
  greedy = perc.make_sampler(graphdef, perc.chain_length(config.eval_max_instances),
                             temperature=0.0)
  sampler = perc.make_sampler(graphdef, max_actions, temperature=rl_cfg.temperature)
  rng = jax.random.key(config.seed + 1)
  clip_cov_rng = jax.random.key(config.seed + 2)

  def run_eval(step):
    tic = time.perf_counter()
    record = {}
    for name, scenes in (("dense", dense_eval), ("ref", ref_eval)):
      preds, stats = perc.predict(greedy, state.params, scenes, bins,
                                  batch_size=config.eval_batch_size)
      metrics = perc.evaluate_predictions(preds, scenes, stats)
      record.update({f"eval/{name}/{k}": v for k, v in metrics.items()})
    record["time/eval"] = time.perf_counter() - tic
    writer.write(step, record)
    logging.info("step %d eval: dense f1@0.5 %.3f (nms %.3f), redundancy %.3f, ref mcc %.3f",
                 step, record["eval/dense/f1@0.5"], record["eval/dense/nms_f1@0.5"],
                 record["eval/dense/redundancy"], record["eval/ref/mcc"])

  if first_step == 0 and config.eval_at_start:
    run_eval(0)

  # ---- Train loop ----
  g = rl_cfg.group_size
  bar = tqdm.tqdm(range(first_step + 1, config.steps + 1), initial=first_step,
                  total=config.steps, desc=f"perception/{config.phase}", dynamic_ncols=True)
  for step in bar:
    tic = time.perf_counter()
    record = {}
    if config.phase in ("sft", "sft_more"):
      # sft_more continues the data stream after the SFT run's steps (no scene seen twice).
      offset = 10**6 if config.phase == "sft_more" else 0
      scenes = task.batch("train", range(offset + (step - 1) * config.batch_size,
                                         offset + step * config.batch_size))
      batch = perc.sft_batch(scenes, bins, config.max_instances)
      state, metrics = step_fn(state, batch)
    else:
      p = rl_cfg.prompts_per_step
      scenes = task.batch("train", range(2 * 10**6 + (step - 1) * p, 2 * 10**6 + step * p),
                          positive=True)  # RL uses positive queries only (spec §4.6).
      images = np.repeat(np.stack([s.image for s in scenes]), g, axis=0)
      queries = np.repeat(np.stack([s.query.tokens for s in scenes]), g, axis=0)
      rollout = jax.device_get(sampler(state.params, images, queries,
                                       jax.random.fold_in(rng, step)))
      record["time/generate"] = time.perf_counter() - tic
      preds, stats = perc.decode_batch(rollout.chain, rollout.mask, bins)
      gts = [s.boxes for s in scenes for _ in range(g)]
      rewards = perc.count_rewards(preds, gts, kind=rl_cfg.reward, fp_weight=rl_cfg.fp_weight,
                                   iou_threshold=rl_cfg.iou_threshold)
      group_ids = np.repeat(np.arange(p), g)
      # Population std (ddof=0), as in the paper's Â = (r − μ_G) / (σ_G + ε).
      adv = advantages_lib.group_advantages(jnp.asarray(rewards), jnp.asarray(group_ids),
                                            num_groups=p, ddof=0, eps=rl_cfg.advantage_eps)
      # Trim the padded width to the longest rollout (rounded up: a few compiled widths); the
      # Dr.GRPO denominator stays B·T_max with T_max the full decode budget.
      width = int(rollout.mask.sum(-1).max())
      width = min(max_actions, -(-width // rl_cfg.trim_to) * rl_cfg.trim_to)
      batch = dict(images=images, queries=queries,
                   chain=np.stack([a[:, :width] for a in rollout.chain], axis=1),
                   mask=rollout.mask[:, :width], rollout_logp=rollout.logp[:, :width],
                   adv=np.asarray(adv), num_sequences=np.float32(len(preds)),
                   key=jax.random.key_data(jax.random.fold_in(clip_cov_rng, step)))
      state, metrics = step_fn(state, batch)
      total = perc.sum_stats(stats)
      record.update({"train/reward": float(rewards.mean()),
                     "train/reward_std_in_group": float(rewards.reshape(p, g).std(1).mean()),
                     "train/pred_per_gt": sum(map(len, preds)) / max(sum(map(len, gts)), 1),
                     "train/malformed_rate": float(np.mean([s.malformed > 0 for s in stats])),
                     "train/truncated_rate": total.truncated / len(stats),
                     "train/actions": float(rollout.mask.sum(-1).mean())})
    metrics = run_setup.host_metrics(metrics)
    record.update({f"train/{k}": v for k, v in metrics.items()})
    record["time/step"] = time.perf_counter() - tic
    if metrics["nonfinite_streak"] >= config.max_nonfinite_streak:
      raise RuntimeError(f"{int(metrics['nonfinite_streak'])} updates in a row had a non-finite "
                         f"loss or gradient (step {step}); stopping")
    if step % config.log_every == 0 or step == config.steps:
      writer.write(step, record)
    bar.set_postfix(loss=f"{metrics['loss']:.3f}",
                    **({"reward": f"{record['train/reward']:.2f}"} if "train/reward" in record
                       else {}))
    if step % config.eval_every == 0 or step == config.steps:
      run_eval(step)
    if step % config.checkpoint_every == 0 or step == config.steps:
      checkpointer.save(step, state, extra={"phase_step": step})
  checkpointer.close()
  writer.close()
  evals = [r for r in read_metrics(workdir) if "eval/dense/f1@0.5" in r]
  if evals:
    first, last = evals[0], evals[-1]
    print(f"dense F1@0.5 {first['eval/dense/f1@0.5']:.3f} at step {first['step']} → "
          f"{last['eval/dense/f1@0.5']:.3f} at step {last['step']}; referring MCC "
          f"{first['eval/ref/mcc']:.3f} → {last['eval/ref/mcc']:.3f}")


if __name__ == "__main__":
  app.run(main)
