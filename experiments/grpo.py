r"""GRPO-family RL on a verifiable task: sample → reward → advantages → update → evaluate.

  python experiments/grpo.py --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith \
      --config.init_from=/tmp/sft_arith

The policy loss, advantage estimator and KL are chosen by name in the config
(`config.loss.name`, `config.advantage`); see jaxrl_post.losses. Killed and
restarted with the same command, the run resumes from its last checkpoint.

Devices come from `config.mesh` (jaxrl_post.parallel.mesh): the trainer shards
over `--config.mesh.ici_data/ici_fsdp/ici_tensor`, and the sampler shares its
devices or, with `--config.mesh.sampler_devices=n`, has the last n to itself.
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
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import make_placement, maybe_initialize_distributed, put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.sampling import Sampler, rollout_metrics
from jaxrl_post.tasks import data as task_data
from jaxrl_post.training import rl
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.metrics import MetricWriter, read_metrics, write_eval_outcomes
from jaxrl_post.training.preemption import PreemptionGuard
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value

  # ---- Processes and devices: jax.distributed, then the trainer's and the sampler's meshes ----
  # With a launcher's environment (scripts/launch_*.sh) this process joins the
  # others; every process then runs this same program over one global mesh.
  maybe_initialize_distributed()
  # First, so that a mesh that does not fit the devices fails before anything is
  # built; the errors name the `config.mesh.*` keys.
  placement = make_placement(config.mesh)
  train_mesh, train_rules = placement.train_mesh, placement.train_rules
  logging.info("trainer mesh %s, sampler mesh %s (%s)", dict(train_mesh.shape),
               dict(placement.sample_mesh.shape),
               "colocated" if placement.colocated else "disaggregated")

  # ---- Task, tokenizer, model, loss (validated before anything compiles) ----
  task, tokenizer, start, model = run_setup.build_run(config, workdir, train_mesh, train_rules)
  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  # Dr.GRPO's fixed denominator is the generation budget, not the (trimmed) width.
  loss_kwargs.setdefault("max_tokens", config.max_new_tokens)
  try:
    loss_fn = rl.make_policy_loss(policy_loss=config.loss.name,
                                  temperature=config.temperature, **loss_kwargs)
    advantage_fn = advantages_lib.ADVANTAGES.get(config.advantage)
  except KeyError as e:
    raise ValueError(f"config.loss.name / config.advantage: {e}") from None
  rollouts = config.prompts_per_step * config.group_size
  if rollouts % (config.ppo_mini_batches * config.num_micro_batches):
    raise ValueError(f"config.ppo_mini_batches ({config.ppo_mini_batches}) × "
                     f"config.num_micro_batches ({config.num_micro_batches}) must divide the "
                     f"{rollouts} rollouts per step (prompts_per_step × group_size)")
  reward_names = list(config.reward_weights)
  reward_weights = jnp.asarray([config.reward_weights[k] for k in reward_names], jnp.float32)
  logging.info("start: %s; model %.2fM parameters", start.kind, model.config.num_params() / 1e6)

  # ---- Data ----
  # Each process reads its own logical shards of the prompts; the step's global
  # batch is their concatenation (tasks.data.ShardedLoader).
  source = task_data.TaskSource(task, "train", config.num_train_examples)
  loader = task_data.ShardedLoader(source, global_batch_size=config.prompts_per_step,
                                   num_shards=config.data_shards, seed=config.seed)
  eval_records = [task.make_example("test", i) for i in range(config.eval_examples)]

  # ---- Train state, reference model, update step, restore ----
  updates_per_step = config.ppo_epochs * config.ppo_mini_batches
  optimizer = run_setup.build_optimizer(config, config.steps * updates_per_step)
  # Born sharded on the trainer's mesh; the optimizer moments follow their parameters.
  state = create_train_state(model, optimizer, jax.random.key(config.seed), mesh=train_mesh,
                             rules=train_rules)
  graphdef = nnx.split(model)[0]
  step_fn = make_train_step(graphdef, loss_fn, optimizer,
                            num_micro_batches=config.num_micro_batches, mesh=train_mesh,
                            rules=train_rules, shared=("num_tokens", "num_sequences"))
  checkpointer = Checkpointer(run_setup.checkpoint_dir(workdir),
                              max_to_keep=config.keep_checkpoints)
  # The frozen reference is the starting policy (SFT or HF weights): restore
  # the starting point first, copy it, then apply this workdir's checkpoint,
  # so a resumed run has the same reference as one that never stopped. Restores
  # take the shardings of `state`, and the copy keeps them: the reference lives
  # on the trainer's mesh in the trainer's layout.
  initial = run_setup.start_point(config, workdir, ignore_workdir=True)
  state, extra = run_setup.restore(initial, checkpointer, state)
  # Without a KL term (beta = 0, the default) no reference is kept: a frozen
  # copy would cost a whole model of device memory for nothing.
  reference_params = jax.tree.map(jnp.copy, state.params) if config.loss.beta > 0 else None
  if start.kind == "workdir":
    state, extra = run_setup.restore(start, checkpointer, state)
  data_iter = iter(loader)
  if "data" in extra:
    data_iter.set_state(extra["data"])
  first_step = int(extra.get("rl_step", 0))
  writer = MetricWriter(workdir, resume_step=first_step if start.kind == "workdir" else None)
  writer.write_config(config)
  sampler = Sampler(model, tokenizer, max_prompt_len=config.prompt_len,
                    mesh=placement.sample_mesh, rules=placement.sample_rules)
  # Old-policy and reference log-probs are scored by the trainer: on its mesh,
  # in its layout, from `state.params` and `reference_params` as they are.
  # `old_logp` then comes from the same parameters and sharding as the update's
  # forward pass, so the first PPO ratio is 1 up to float noise, and
  # `rollout/logp_*` measure the sampler/trainer mismatch they are meant to.
  # The frozen reference needs no second copy in the sampler's layout (whose
  # devices hold the KV cache), and for scoring only the token batch moves.
  scorer = Sampler(model, tokenizer, max_prompt_len=config.prompt_len, mesh=train_mesh,
                   rules=train_rules)
  rng = jax.random.key(config.seed + 1)
  g = config.group_size

  def sampler_params():
    # The parameters in the sampler's layout: a re-layout in place when
    # colocated (nothing when the layouts agree), a device-to-device copy when
    # disaggregated. The result may alias `state.params`, which the next update
    # donates, so it is made afresh before each use.
    return reshard_state(state.params, placement.sample_mesh, placement.sample_rules)

  def run_eval(step):
    evaluation = rl.evaluate(sampler, sampler_params()[0], task, eval_records,
                             max_new_tokens=config.max_new_tokens, k=config.eval_pass_k,
                             temperature=config.temperature, rng=jax.random.key(step),
                             timeout_s=config.reward_timeout_s)
    metrics = evaluation.metrics
    writer.write(step, {f"eval/{k}": v for k, v in metrics.items()})
    # Per prompt, so that two steps can be compared pairwise (rl.paired_gain).
    write_eval_outcomes(workdir, step, greedy_correct=evaluation.greedy_correct,
                        sample_correct=evaluation.sample_correct)
    logging.info("step %d eval: %s", step, metrics)
    return metrics

  if first_step == 0:
    run_eval(0)
  # ---- Train loop ----
  bar = tqdm.tqdm(range(first_step + 1, config.steps + 1), initial=first_step,
                  total=config.steps, desc="grpo", dynamic_ncols=True)
  with PreemptionGuard() as guard, multihost.peer_failures_are_fatal("GRPO training"):
    for step in bar:
      timings = {}
      records = next(data_iter)
      records = [{k: records[k][i] for k in records} for i in range(len(records["prompt"]))]
      # This process's records, then everyone's: every process holds the global
      # batch (the same list in one process, after a JSON round trip).
      records = multihost.allgather_records(records)
      params, timings["time/reshard"] = sampler_params()
      tic = time.perf_counter()
      rollout = sampler.generate(params, [r["prompt"] for r in records],
                                 n_samples_per_prompt=g, max_new_tokens=config.max_new_tokens,
                                 temperature=config.temperature, top_k=config.top_k,
                                 top_p=config.top_p, rng=jax.random.fold_in(rng, step))
      rollout.completion_tokens.block_until_ready()
      timings["time/generate"] = time.perf_counter() - tic
      # Colocated, the sampler's copy holds a whole tensor shard of the model on
      # every device; free it before the update needs the memory.
      del params
      texts = sampler.decode_text(rollout)
      correct, fmt, failures = rl.rewards_for(task, records, texts, g,
                                              timeout_s=config.reward_timeout_s)
      rewards = np.stack([{"correct": correct, "format": fmt}[k] for k in reward_names], axis=1)
      adv = advantage_fn(jnp.asarray(rewards), rollout.group_ids, num_groups=len(records),
                         eps=config.advantage_eps, reward_weights=reward_weights)
      tic = time.perf_counter()
      # To the host (the rollout may sit on the sampler's devices, or on other
      # processes), then onto the trainer's mesh, rows split over its batch axes.
      batch = rl.trim_completions(multihost.to_host(dict(
        prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
        completion_tokens=rollout.completion_tokens, completion_mask=rollout.completion_mask,
        adv=adv)), config.trim_completions_to)
      inputs = put_batch(batch_inputs(batch), train_mesh, train_rules)
      old = scorer.score(state.params, **inputs, temperature=config.temperature,
                         num_micro_batches=config.score_micro_batches)
      batch["old_logp"] = multihost.to_host(old.logp)
      timings["time/score"] = time.perf_counter() - tic
      if config.loss.beta > 0:
        tic = time.perf_counter()
        batch["ref_logp"] = multihost.to_host(scorer.score(
          reference_params, **inputs, temperature=config.temperature,
          num_micro_batches=config.score_micro_batches).logp)
        timings["time/reference"] = time.perf_counter() - tic
      tic = time.perf_counter()
      # PPO: `ppo_epochs` passes over the rollouts, each in `ppo_mini_batches`
      # shuffled updates; the shuffle depends only on (seed, step), so a
      # resumed run takes the same updates.
      shuffle = np.random.default_rng([config.seed, step])
      updates = []
      for _ in range(config.ppo_epochs):
        for mini_batch in rl.ppo_mini_batches(batch, config.ppo_mini_batches, shuffle):
          state, metrics = step_fn(state, put_batch(mini_batch, train_mesh, train_rules))
          updates.append(metrics)
      metrics = rl.mean_update_metrics([run_setup.host_metrics(m) for m in updates])
      timings["time/update"] = time.perf_counter() - tic
      if metrics["nonfinite_streak"] >= config.max_nonfinite_streak:
        raise RuntimeError(f"{int(metrics['nonfinite_streak'])} updates in a row had a "
                           f"non-finite loss or gradient (step {step}); stopping")
      tokens = int(batch["completion_mask"].sum())
      record = {f"train/{k}": v for k, v in metrics.items()}
      record.update({f"rollout/{k}": v for k, v in rollout_metrics(rollout, old.logp).items()})
      record.update({"train/reward_correct": float(np.nanmean(correct)),
                     "train/reward_format": float(np.nanmean(fmt)),
                     "train/reward_failures": failures.total,
                     "train/reward_errors": failures.errors,
                     "train/reward_timeouts": failures.timeouts,
                     "train/tokens_per_s": tokens / sum(timings.values()), **timings})
      if step % config.log_every == 0 or step == config.steps:
        writer.write(step, record)
      bar.set_postfix(reward=f"{record['train/reward_correct']:.3f}",
                      tok_s=f"{record['train/tokens_per_s']:.0f}")
      if step % config.eval_every == 0 or step == config.steps:
        run_eval(step)
      if step % config.checkpoint_every == 0 or step == config.steps or guard.requested:
        checkpointer.save(step, state, extra={"data": data_iter.get_state(), "rl_step": step})
      if guard.requested:
        guard.report_stop(step)
        break
  checkpointer.close()
  writer.close()
  evals = [r for r in read_metrics(workdir) if "eval/accuracy" in r]
  if evals:
    print(f"held-out accuracy: {evals[0]['eval/accuracy']:.3f} at step {evals[0]['step']} → "
          f"{evals[-1]['eval/accuracy']:.3f} at step {evals[-1]['step']}")


def batch_inputs(batch):
  return {k: batch[k] for k in ("prompt_tokens", "prompt_mask", "completion_tokens",
                                "completion_mask")}


if __name__ == "__main__":
  app.run(main)
