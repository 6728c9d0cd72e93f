r"""PPO on brax tasks: XLA compile time and env steps/s, against gymnax CartPole from the same run.

  python scripts/bench_brax.py                          # reacher, hopper at the config's sizes
  python scripts/bench_brax.py --envs=reacher --num_envs=4 --num_steps=8 --updates=1 \
      --repeats=1 --fast_compile                        # smoke test

Each env is `configs/mlref_brax.py:env=<env>` (its episode length, backend and PPO settings:
32 envs x 64 steps, 8 minibatches, running obs / reward normalisation), with
`--num_envs --num_steps --updates` overriding the rollout size and the number of PPO updates U
(total_timesteps = U x num_envs x num_steps). One `jax.jit(make_train)` per env, `--seeds` seeds
vmapped as in `ppo.train_seeds`. Prints JSON lines:
  {"what": "reference_cartpole", "steps_per_s": ..., "compile_s": ..., ...}
  {"what": "ppo_brax", "env": ..., "compile_s": ..., "steps_per_s": ...,
   "steps_per_s_vs_cartpole": ..., ...}
compile_s: `lower(...).compile()` wall clock (tracing excluded); steps_per_s: env steps of all
seeds (U x num_envs x num_steps x seeds) over the median wall clock of a whole training call
(`--repeats` calls after one warm-up), i.e. rollouts *and* PPO updates. The CartPole reference
runs the same PPO sizes and switches, so the ratio is the cost of the brax physics relative to
a near-free env, and comparable across machines and loads.
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from absl import app, flags

from jaxrl_post.benchmarking import median_seconds
from jaxrl_post.config_args import load_module
from jaxrl_post.rl_control import envs, ppo

ROOT = Path(__file__).resolve().parents[1]

_ENVS = flags.DEFINE_list("envs", ["reacher", "hopper"], "Brax envs of configs/mlref_brax.py.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "Parallel envs (default: the config's).")
_NUM_STEPS = flags.DEFINE_integer("num_steps", None, "Rollout length (default: the config's).")
_UPDATES = flags.DEFINE_integer("updates", 5, "PPO updates per timed call.")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Seeds vmapped in one call.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed calls (after one warm-up call).")
_FAST_COMPILE = flags.DEFINE_bool("fast_compile", False, "XLA -O0 (ppo.FAST_COMPILE).")


def _brax_config(env: str):
  return load_module(ROOT / "configs/mlref_brax.py", "_mlref_brax").get_config(f"env={env}")


def _ppo_config(env: str) -> ppo.PPOConfig:
  fields = _brax_config(env).ppo.to_dict()
  num_envs = _NUM_ENVS.value or fields["num_envs"]
  num_steps = _NUM_STEPS.value or fields["num_steps"]
  fields.update(num_envs=num_envs, num_steps=num_steps,
                total_timesteps=_UPDATES.value * num_envs * num_steps)
  fields["num_minibatches"] = min(fields["num_minibatches"], num_envs * num_steps)
  return ppo.PPOConfig(**fields)


def _measure(cfg: ppo.PPOConfig, task) -> dict:
  """Compile seconds and env steps/s of `make_train` vmapped over `--seeds`."""
  rngs = jnp.stack([jax.random.PRNGKey(s) for s in range(_SEEDS.value)])
  lowered = jax.jit(jax.vmap(ppo.make_train(cfg, task))).lower(rngs)
  tic = time.perf_counter()
  compiled = lowered.compile(compiler_options=ppo.FAST_COMPILE if _FAST_COMPILE.value else None)
  compile_s = time.perf_counter() - tic
  seconds = median_seconds(lambda: jax.block_until_ready(compiled(rngs)), _REPEATS.value)
  steps = cfg.num_updates * cfg.num_envs * cfg.num_steps * _SEEDS.value
  return {"compile_s": compile_s, "run_s": seconds, "env_steps": steps,
          "steps_per_s": steps / seconds}


def _sizes(cfg: ppo.PPOConfig) -> dict:
  return {"num_envs": cfg.num_envs, "num_steps": cfg.num_steps, "updates": cfg.num_updates,
          "num_minibatches": cfg.num_minibatches, "update_epochs": cfg.update_epochs,
          "seeds": _SEEDS.value, "normalize_obs": cfg.normalize_obs,
          "normalize_reward": cfg.normalize_reward, "fast_compile": _FAST_COMPILE.value}


def main(argv):
  del argv
  configs = {env: _ppo_config(env) for env in _ENVS.value}
  # The reference: the first env's PPO settings (all envs share them) on gymnax CartPole.
  ref_cfg = next(iter(configs.values()))
  reference = {"what": "reference_cartpole", "env": "CartPole-v1",
               **_measure(ref_cfg, envs.make_task("CartPole-v1")), **_sizes(ref_cfg),
               "backend": jax.default_backend()}
  print(json.dumps(reference), flush=True)
  for env, cfg in configs.items():
    name = _brax_config(env).env
    row = _measure(cfg, envs.make_task(name))
    print(json.dumps({"what": "ppo_brax", "env": env, "task": name, **row,
                      "steps_per_s_vs_cartpole": row["steps_per_s"] / reference["steps_per_s"],
                      **_sizes(cfg), "backend": jax.default_backend()}), flush=True)


if __name__ == "__main__":
  app.run(main)
