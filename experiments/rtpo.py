r"""Multi-turn agentic RL: RTPO (arXiv 2608.18682) against turn-level and flattened GRPO.

  python experiments/rtpo.py --config=configs/rtpo_calculator.py:method=sft,horizon=4 \
      --workdir=/tmp/rtpo/sft_k4
  python experiments/rtpo.py --config=configs/rtpo_calculator.py:method=rtpo,horizon=4 \
      --workdir=/tmp/rtpo/rtpo_k4 --config.init_from=/tmp/rtpo/sft_k4

`method` is `sft` (cold start on the env's demonstrations, each turn under ψ), `flat_grpo`,
`turn_grpo` or `rtpo` (see jaxrl_post/training/rtpo.py). Every run counts the tokens it generates
for training (`budget/generated_tokens`) and stops at `config.max_generated_tokens`, so methods
can be compared at equal sampling budgets; `eval/success` is the greedy success rate on held-out
episodes and `eval/sampled_success` the success of sampling at the training temperature.
Killed and restarted with the same command, a run resumes from its last checkpoint and logs the
same metrics as one that never stopped (wall-clock times aside).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_post.envs import get_env, make_context
from jaxrl_post.training import multiturn
from jaxrl_post.training import rtpo as methods
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.metrics import MetricWriter, read_metrics
from jaxrl_post.training.preemption import PreemptionGuard
from jaxrl_post.training.rtpo_configs import SFT
from jaxrl_post.training.train_state import create_train_state

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  sft = config.method == SFT

  # ---- Env, tokenizer, context, model, method (validated before anything compiles) ----
  tokenizer = multiturn.build_tokenizer(config.tokenizer)
  try:
    env = get_env(config.env, **dict(config.env_knobs))
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"config.env / config.env_knobs: {e}") from None
  context = make_context(config.context.to_dict(), tokenizer=tokenizer)
  method = None
  if not sft:
    method = methods.MethodConfig(
      method=config.method, group_size=config.group_size,
      trunks_per_prompt=config.trunks_per_prompt, advantage=config.advantage,
      advantage_eps=config.advantage_eps, continuation=config.continuation,
      rho_min=config.rho_min, rho_max=config.rho_max,
      skip_zero_advantage=config.skip_zero_advantage)
  start = run_setup.start_point(config, workdir)
  model = run_setup.build_model(config, tokenizer, start)
  logging.info("%s on %s (K=%d); start: %s; model %.2fM parameters", config.method, config.env,
               env.horizon, start.kind, model.config.num_params() / 1e6)

  # ---- Train state, restore ----
  optimizer = run_setup.build_optimizer(config, config.steps)
  state = create_train_state(model, optimizer, jax.random.key(config.seed))
  checkpointer = Checkpointer(run_setup.checkpoint_dir(workdir),
                              max_to_keep=config.keep_checkpoints)
  # The reference of a KL term is the starting policy (the SFT one), also after a resume.
  initial = run_setup.start_point(config, workdir, ignore_workdir=True)
  state, extra = run_setup.restore(initial, checkpointer, state)
  reference = jax.tree.map(jnp.copy, state.params) if config.loss.beta > 0 else None
  if start.kind == "workdir":
    state, extra = run_setup.restore(start, checkpointer, state)
  first_step = int(extra.get("rl_step", 0))
  generated = int(extra.get("generated_tokens", 0))
  wall = float(extra.get("wall_s", 0.0))
  writer = MetricWriter(workdir, resume_step=first_step if start.kind == "workdir" else None)
  writer.write_config(config)

  # ---- Learner (sampler, batches, jitted updates) ----
  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  learner = methods.Learner(
    model, tokenizer, optimizer, env=env, context=context, loss=config.loss.name,
    loss_kwargs=loss_kwargs, max_turn_tokens=config.max_turn_tokens,
    max_context_len=config.max_context_len, flat_len=config.flat_len,
    temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
    num_micro_batches=config.num_micro_batches, ppo_epochs=config.ppo_epochs,
    ppo_mini_batches=config.ppo_mini_batches, reference_params=reference,
    add_bos=config.add_bos, bucket_widths=config.bucket_widths,
    sampler_batch_buckets=tuple(config.sampler_batch_buckets),
    sampler_len_buckets=tuple(config.sampler_len_buckets))
  rng = jax.random.key(config.seed + 1)
  eval_indices = range(config.eval_episodes)

  def run_eval(step):
    tic = time.perf_counter()
    metrics = methods.evaluate(learner, state.params, env, eval_indices, split=config.eval_split)
    record = {f"eval/{k}": v for k, v in metrics.items()}
    if config.eval_sampled:
      # The same key at every evaluation, so the curve is not noisier than the policy.
      sampled = methods.evaluate(learner, state.params, env, eval_indices,
                                 split=config.eval_split, greedy=False,
                                 rng=jax.random.key(config.seed + 2))
      record.update({f"eval/sampled_{k}": v for k, v in sampled.items()})
    record["eval/time"] = time.perf_counter() - tic
    record["budget/generated_tokens"] = generated
    writer.write(step, record)
    logging.info("step %d eval: success %.3f", step, metrics["success"])
    return metrics

  def episodes(step):
    # A function of (seed, step) only, so a resumed run sees the same episodes.
    draw = np.random.default_rng([config.seed, step])
    return [int(i) for i in draw.choice(config.num_train_episodes, size=config.prompts_per_step
                                        if not sft else config.episodes_per_step, replace=False)]

  if first_step == 0:
    run_eval(0)
  last_step = config.steps
  if config.max_generated_tokens and generated >= config.max_generated_tokens:
    last_step = first_step  # the budget was spent before this restart: nothing is left to do
  # ---- Train loop ----
  bar = tqdm.tqdm(range(first_step + 1, last_step + 1), initial=first_step,
                  total=config.steps, desc=config.method, dynamic_ncols=True)
  with PreemptionGuard() as guard:
    for step in bar:
      tic = time.perf_counter()
      indices = episodes(step)
      if sft:
        turns = multiturn.demonstration_turns(env, indices, tokenizer=tokenizer, context=context,
                                              max_context_len=config.max_context_len,
                                              add_bos=config.add_bos)
        state, update = learner.sft(state, learner.turn_batch(turns, np.zeros(len(turns))))
        record = {f"train/{k}": v for k, v in update.items()}
        step_tokens = 0
      else:
        out = methods.method_step(
          state, learner, [env.initial_state(i, "train") for i in indices], config=method,
          rng=jax.random.fold_in(rng, step), shuffle=np.random.default_rng([config.seed, step, 1]))
        state, record, step_tokens = out.state, out.metrics, out.generated_tokens
      generated += step_tokens
      elapsed = time.perf_counter() - tic
      wall += elapsed
      if record.get("train/nonfinite_streak", 0) >= config.max_nonfinite_streak:
        raise RuntimeError(f"{int(record['train/nonfinite_streak'])} updates in a row had a "
                           f"non-finite loss or gradient (step {step}); stopping")
      record.update({"budget/generated_tokens": generated, "budget/step_tokens": step_tokens,
                     "time/step": elapsed, "time/wall": wall})
      if step % config.log_every == 0 or step == config.steps:
        writer.write(step, record)
      postfix = {"success": record.get("rollout/success", float("nan")),
                 "nll": record.get("train/nll", float("nan")), "tokens": generated}
      bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items() if v == v})
      over_budget = bool(config.max_generated_tokens) and generated >= config.max_generated_tokens
      done = step == config.steps or over_budget
      if step % config.eval_every == 0 or done:
        run_eval(step)
      if step % config.checkpoint_every == 0 or done or guard.requested:
        checkpointer.save(step, state, extra={"rl_step": step, "generated_tokens": generated,
                                              "wall_s": wall})
      if over_budget:
        print(f"generated-token budget reached: {generated} >= {config.max_generated_tokens} "
              f"after step {step}")
        break
      if guard.requested:
        guard.report_stop(step)
        break
  checkpointer.close()
  writer.close()
  evals = [r for r in read_metrics(workdir) if "eval/success" in r]
  if evals:
    print(f"{config.method} K={env.horizon}: held-out greedy success "
          f"{evals[0]['eval/success']:.3f} at step {evals[0]['step']} → "
          f"{evals[-1]['eval/success']:.3f} at step {evals[-1]['step']} "
          f"({generated} generated tokens, {wall:.0f} s)")


if __name__ == "__main__":
  app.run(main)
