r"""One GRPO step, timed by phase, with update throughput against a matmul peak from the same run.

  python scripts/bench_train_step.py                                 # `small`, arith, CPU
  python scripts/bench_train_step.py --config=configs/grpo_arith.py:model=qwen3_0p6b \
      --config.model_overrides.num_layers=2 --steps=2

The step is the one `experiments/grpo.py` runs (random-init policy, so
completions mostly run to `max_new_tokens`: the slow case): generate → reward
→ advantages → score (old policy) → reference → update. Prints JSON lines:
  {"what": "matmul_peak", ...}
  {"what": "grpo_step", "time/generate": ..., "time/score": ..., "time/reference": ...,
   "time/update": ..., "update_tokens_per_s": ..., "update_mfu": ..., ...}
Times are medians over `--steps` steps after one warm-up (compile) step.
Update FLOPs: 3 × forward FLOPs (forward + backward) of every padded token the
update processes, `ModelConfig.flops_per_token(seq_len)` per token.
"""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from jaxrl_post import advantages as advantages_lib
from jaxrl_post.benchmarking import matmul_peak
from jaxrl_post.sampling import Sampler
from jaxrl_post.training import rl
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import StartPoint
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", "configs/grpo_arith.py", "GRPO config.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed RL steps (after one warm-up step).")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 1024, "Matrix size of the peak reference.")


def _timed(timings, name, fn, *args, **kwargs):
  tic = time.perf_counter()
  out = jax.block_until_ready(fn(*args, **kwargs))
  timings[name] = time.perf_counter() - tic
  return out


def main(argv):
  del argv
  config = _CONFIG.value
  reference = matmul_peak(_MATMUL_N.value)
  print(json.dumps(reference), flush=True)

  task = run_setup.build_task(config)
  tokenizer = run_setup.build_tokenizer(config)
  model = run_setup.build_model(config, tokenizer, StartPoint("scratch"))
  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  loss_fn = rl.make_policy_loss(policy_loss=config.loss.name, temperature=config.temperature,
                                **loss_kwargs)
  optimizer = run_setup.build_optimizer(config, 1000)
  state = create_train_state(model, optimizer, jax.random.key(config.seed))
  reference_params = jax.tree.map(jnp.copy, state.params)
  step_fn = make_train_step(nnx.split(model)[0], loss_fn, optimizer,
                            num_micro_batches=config.num_micro_batches,
                            shared=("num_tokens", "num_sequences"))
  sampler = Sampler(model, tokenizer, max_prompt_len=config.prompt_len)
  advantage_fn = advantages_lib.ADVANTAGES.get(config.advantage)
  g = config.group_size
  rows = []
  for step in range(_STEPS.value + 1):
    records = [task.make_example("train", step * config.prompts_per_step + i)
               for i in range(config.prompts_per_step)]
    timings = {}
    rollout = _timed(timings, "time/generate", sampler.generate, state.params,
                     [r["prompt"] for r in records], n_samples_per_prompt=g,
                     max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                     rng=jax.random.key(step))
    tic = time.perf_counter()
    correct, fmt, _ = rl.rewards_for(task, records, sampler.decode_text(rollout), g)
    adv = advantage_fn(jnp.asarray(np.stack([correct, fmt], 1)), rollout.group_ids,
                       num_groups=len(records), eps=config.advantage_eps)
    timings["time/reward"] = time.perf_counter() - tic
    batch = dict(prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
                 completion_tokens=rollout.completion_tokens,
                 completion_mask=rollout.completion_mask, adv=adv)
    inputs = {k: v for k, v in batch.items() if k != "adv"}
    batch["old_logp"] = _timed(timings, "time/score", sampler.score, state.params, **inputs,
                               temperature=config.temperature).logp
    batch["ref_logp"] = _timed(timings, "time/reference", sampler.score, reference_params,
                               **inputs, temperature=config.temperature).logp
    tic = time.perf_counter()
    shuffle = np.random.default_rng(step)
    for _ in range(config.ppo_epochs):
      for mini_batch in rl.ppo_mini_batches(batch, config.ppo_mini_batches, shuffle):
        state, metrics = step_fn(state, mini_batch)
    jax.block_until_ready(metrics)
    timings["time/update"] = time.perf_counter() - tic
    seq_len = rollout.prompt_tokens.shape[1] + rollout.completion_tokens.shape[1]
    timings["padded_tokens"] = rollout.prompt_tokens.shape[0] * seq_len * config.ppo_epochs
    timings["completion_tokens"] = int(np.asarray(rollout.completion_mask).sum())
    timings["seq_len"] = seq_len
    if step:  # step 0 compiles
      rows.append(timings)

  median = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
  update_flops = 3 * median["padded_tokens"] * model.config.flops_per_token(median["seq_len"])
  phases = ("time/generate", "time/reward", "time/score", "time/reference", "time/update")
  total = sum(median[k] for k in phases)
  print(json.dumps({
    "what": "grpo_step", "model": config.model,
    "params_m": round(model.config.num_params() / 1e6, 2),
    "rollouts": config.prompts_per_step * g, "max_new_tokens": config.max_new_tokens,
    "ppo_epochs": config.ppo_epochs, "ppo_mini_batches": config.ppo_mini_batches,
    "num_micro_batches": config.num_micro_batches, **{k: median[k] for k in phases},
    "time/step": total, **{f"share/{k[5:]}": median[k] / total for k in phases},
    "completion_tokens": median["completion_tokens"],
    "step_completion_tokens_per_s": median["completion_tokens"] / total,
    "update_tokens_per_s": median["padded_tokens"] / median["time/update"],
    "update_tflops": update_flops / median["time/update"] / 1e12,
    "update_mfu": update_flops / median["time/update"] / reference["flops_per_s"],
    "backend": jax.default_backend()}), flush=True)


if __name__ == "__main__":
  app.run(main)
