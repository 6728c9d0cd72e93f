r"""Multi-teacher on-policy distillation (Open-MOPD, arXiv 2608.19098) on a task mixture.

  python experiments/opd.py --config=configs/opd_mix.py:root=/tmp/mopd,method=open_mopd \
      --workdir=/tmp/mopd/open_mopd

Each step: draw a batch with exact per-domain quotas → the student samples one response per
prompt → its top-K ids V and log-probs s on them → each row's routed teacher scores V (q) →
rollout-time rewards r = (q − s)·softmax_K(s) → per-domain weights from the whole batch's
statistics → K mini-batch updates of dual-clip PPO on V (reward refreshed with each update's
student when the method says so) → per-domain metrics and evaluation. The method
(`config.method`: naive, token_share, gap, open_mopd) sets the switches; configs/opd_mix.py has
the whole pipeline (mixed SFT, GRPO teachers, RouteRL reference). Killed and restarted with the
same command, the run resumes from its last checkpoint (state, quota-sampler position, the
step-0 reference totals).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from jaxrl_post import losses
from jaxrl_post.sampling import Sampler, rollout_metrics
from jaxrl_post.tasks.domain_quota import DomainQuotaSampler
from jaxrl_post.training import opd, rl
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.metrics import MetricWriter, read_metrics
from jaxrl_post.training.preemption import PreemptionGuard
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value

  # ---- Task, tokenizer, model, method, teachers (validated before anything compiles) ----
  task, tokenizer, start, model = run_setup.build_run(config, workdir)
  if not hasattr(task, "domains"):
    raise ValueError(f"config.task={config.task!r} has no domains; use task='mixture'")
  domains = task.domains
  method = opd.resolve_method(config.method, **{k: config.opd[k] for k in opd.Method._fields})
  routing = opd.teacher_routing(dict(config.teachers), domains)
  teacher_starts = opd.find_teacher_checkpoints(routing)
  target_shares = opd.target_share_vector(dict(config.opd.target_shares), domains)
  n = config.samples_per_prompt
  rows = config.prompts_per_step * n
  if rows % (method.inner_updates * config.num_micro_batches):
    raise ValueError(f"inner_updates ({method.inner_updates}) × config.num_micro_batches "
                     f"({config.num_micro_batches}) must divide the {rows} rollouts per step")
  if not 1 <= config.topk <= tokenizer.vocab_size:
    raise ValueError(f"config.topk={config.topk} must be in [1, {tokenizer.vocab_size}]")
  logging.info("start: %s; method %s = %s; teachers %s", start.kind, config.method, method,
               dict(zip(domains, (routing.paths[t] for t in routing.teacher_of_domain))))

  # ---- Data: exact per-domain quotas in every batch ----
  quota = DomainQuotaSampler(task.weights, pool_sizes=task.pool_sizes(config.num_train_examples),
                             batch_size=config.prompts_per_step, seed=config.seed)
  eval_records = {d: [task.make_domain_example(d, "test", j) for j in range(config.eval_examples)]
                  for d in domains}
  logging.info("per-batch quotas %s", dict(zip(domains, quota.quotas)))

  # ---- Train state, teachers, update step, restore ----
  optimizer = run_setup.build_optimizer(config, config.steps * method.inner_updates)
  state = create_train_state(model, optimizer, jax.random.key(config.seed))
  teacher_params = opd.load_teachers(teacher_starts, state)
  graphdef = nnx.split(model)[0]
  loss_fn = opd.make_opd_loss(
    num_domains=len(domains), temperature=config.temperature, refresh=method.refresh,
    epsilon_low=config.opd.epsilon_low, epsilon_high=config.opd.epsilon_high,
    dual_clip_c=config.opd.dual_clip_c, max_log_ratio=config.opd.max_log_ratio)
  step_fn = make_train_step(graphdef, loss_fn, optimizer,
                            num_micro_batches=config.num_micro_batches,
                            shared=("num_tokens", "num_sequences"))
  checkpointer = Checkpointer(run_setup.checkpoint_dir(workdir),
                              max_to_keep=config.keep_checkpoints)
  state, extra = run_setup.restore(start, checkpointer, state)
  # Commit the state to where it lives. Restored teachers are committed arrays; a student built
  # from scratch is not, and the first update (mixing both) would commit it, which changes
  # every jitted call's signature: the whole step would compile twice.
  state = jax.device_put(state, jax.tree.map(lambda x: x.sharding, state))
  if "quota_sampler" in extra:
    quota.set_state(extra["quota_sampler"])
  first_step = int(extra.get("rl_step", 0))
  reference = dict(extra.get("reference", {}))  # step-0 totals: MixSFT and RouteRL
  writer = MetricWriter(workdir, resume_step=first_step if start.kind == "workdir" else None)
  writer.write_config(config)
  # One prompt width for all generation: batches mixing the domains need the longest prompts
  # anyway, and evaluations of short-prompt domains then reuse the same compiled kernels.
  sampler = Sampler(model, tokenizer, max_prompt_len=config.prompt_len,
                    prompt_len_buckets=(config.prompt_len,))
  score_fn = opd.sampler_score_fn(sampler, temperature=config.temperature)
  # With exact quotas every domain has a fixed row count: the largest one is the teachers'
  # fixed scoring shape (one compile for all of them).
  rows_per_call = max(quota.quotas) * n
  rng = jax.random.key(config.seed + 1)

  def run_eval(step):
    metrics = opd.evaluate_domains(sampler, lambda d: state.params, task, eval_records,
                                   max_new_tokens=config.max_new_tokens,
                                   timeout_s=config.reward_timeout_s)
    if step == 0 and "student_total" not in reference:
      reference["student_total"] = metrics["total"]
    if "route_total" in reference and reference["route_total"] != reference["student_total"]:
      metrics["headroom_recovery"] = float(losses.headroom_recovery(
        metrics["total"], reference["student_total"], reference["route_total"]))
    writer.write(step, {f"eval/{k}": v for k, v in metrics.items()})
    logging.info("step %d eval: %s", step, metrics)
    return metrics

  if first_step == 0:
    if config.eval_teachers:
      route = opd.evaluate_domains(
        sampler, lambda d: teacher_params[routing.teacher_of_domain[domains.index(d)]], task,
        eval_records, max_new_tokens=config.max_new_tokens, timeout_s=config.reward_timeout_s)
      reference["route_total"] = route["total"]
      writer.write(0, {f"route/{k}": v for k, v in route.items()})
      logging.info("RouteRL reference (each domain by its teacher): %s", route)
    run_eval(0)

  # ---- Train loop ----
  bar = tqdm.tqdm(range(first_step + 1, config.steps + 1), initial=first_step,
                  total=config.steps, desc=f"opd:{config.method}", dynamic_ncols=True)
  with PreemptionGuard() as guard:
    for step in bar:
      timings = {}
      drawn = quota.next_batch()
      records = [task.make_domain_example(d, "train", int(j))
                 for d, j in zip(drawn["domain"], drawn["index"])]
      domain_ids = np.repeat(losses.encode_domain_labels(list(drawn["domain"]), domains), n)
      tic = time.perf_counter()
      rollout = sampler.generate(state.params, [r["prompt"] for r in records],
                                 n_samples_per_prompt=n, max_new_tokens=config.max_new_tokens,
                                 temperature=config.temperature, top_p=config.top_p,
                                 num_logprobs=config.topk, rng=jax.random.fold_in(rng, step))
      rollout.completion_tokens.block_until_ready()
      timings["time/generate"] = time.perf_counter() - tic
      batch = dict(prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
                   completion_tokens=rollout.completion_tokens,
                   completion_mask=rollout.completion_mask)
      mask = rollout.completion_mask

      # Old student on its own top-K ids V (the trainer's numerics, so the first update's
      # ratio is 1), then each row's routed teacher on the same ids.
      tic = time.perf_counter()
      old = sampler.score(state.params, **batch, temperature=config.temperature,
                          candidate_ids=rollout.topk_ids)
      old_topk = old.candidate_logp.block_until_ready()
      timings["time/score_student"] = time.perf_counter() - tic
      tic = time.perf_counter()
      teacher_topk = opd.score_routed(score_fn, teacher_params, routing.teacher_of_domain, batch,
                                      domain_ids, rollout.topk_ids, rows_per_call=rows_per_call)
      teacher_topk.block_until_ready()
      timings["time/score_teachers"] = time.perf_counter() - tic

      # Rollout-time reward and the domain weights, from the whole batch, before any split.
      rewards = losses.topk_opd_reward(old_topk, teacher_topk, mask)
      weights, table = opd.rollout_domain_weights(
        mask, domain_ids, rewards, num_domains=len(domains), method=method,
        target_shares=target_shares, clip_min=config.opd.gap_clip_min,
        clip_max=config.opd.gap_clip_max, reference=config.opd.gap_reference)
      batch.update(topk_ids=rollout.topk_ids, old_topk_logp=old_topk,
                   teacher_topk_logp=teacher_topk, seq_weights=weights,
                   domain_ids=jnp.asarray(domain_ids))

      # K inner updates; the shuffle depends only on (seed, step), so a resumed run takes the
      # same updates.
      tic = time.perf_counter()
      state, updates = opd.inner_updates(step_fn, state, batch, method.inner_updates,
                                         np.random.default_rng([config.seed, step]))
      metrics = opd.update_metrics(updates, domains)
      timings["time/update"] = time.perf_counter() - tic
      if metrics["nonfinite_streak"] >= config.max_nonfinite_streak:
        raise RuntimeError(f"{int(metrics['nonfinite_streak'])} updates in a row had a "
                           f"non-finite loss or gradient (step {step}); stopping")

      # Task rewards of the rollouts (not trained on: a progress signal per domain).
      correct, fmt, failures = rl.rewards_for(task, records, sampler.decode_text(rollout), n,
                                              timeout_s=config.reward_timeout_s)
      record = {f"train/{k}": v for k, v in metrics.items() if "/" not in k}
      record.update({f"domain/{k}": v for k, v in metrics.items() if "/" in k})
      record.update({f"domain/{k}": v for k, v in opd.rollout_domain_metrics(
        mask, domain_ids, rewards, weights, table, domains).items()})
      for i, d in enumerate(domains):
        record[f"domain/{d}/reward_correct"] = float(np.nanmean(correct[domain_ids == i]))
      rollout_stats = rollout_metrics(rollout)
      top_diff = np.abs(np.asarray(rollout.topk_logp) - np.asarray(old_topk))[np.asarray(mask)]
      rollout_stats["topk_logp_abs_diff_max"] = float(top_diff.max()) if top_diff.size else 0.0
      record.update({f"rollout/{k}": v for k, v in rollout_stats.items()})
      tokens = int(np.asarray(mask).sum())
      record.update({"train/reward_correct": float(np.nanmean(correct)),
                     "train/reward_format": float(np.nanmean(fmt)),
                     "train/reward_failures": failures.total,
                     "train/tokens_per_s": tokens / sum(timings.values()), **timings})
      if step % config.log_every == 0 or step == config.steps:
        writer.write(step, record)
      bar.set_postfix(reward=f"{record['train/reward_mean']:.3f}",
                      stale=f"{record['train/staleness_kl_last']:.2g}")
      if step % config.eval_every == 0 or step == config.steps:
        run_eval(step)
      if step % config.checkpoint_every == 0 or step == config.steps or guard.requested:
        checkpointer.save(step, state, extra={"quota_sampler": quota.get_state(),
                                              "rl_step": step, "reference": reference})
      if guard.requested:
        guard.report_stop(step)
        break
  checkpointer.close()
  writer.close()
  evals = [r for r in read_metrics(workdir) if "eval/total" in r]
  if evals:
    first, last = evals[0], evals[-1]
    per_domain = ", ".join(f"{d} {last[f'eval/{d}/accuracy']:.3f}" for d in domains)
    print(f"held-out Total {first['eval/total']:.3f} at step {first['step']} → "
          f"{last['eval/total']:.3f} at step {last['step']} ({per_domain})")
  if "route_total" in reference:
    print(f"RouteRL reference Total {reference['route_total']:.3f}")


if __name__ == "__main__":
  app.run(main)
