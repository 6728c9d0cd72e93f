r"""CrystalGRPO's gradient under LeanGRPO's schedules: seconds per update, native as reference.

  python scripts/bench_crystal_schedules.py                 # the config's grpo shapes, mode q
  python scripts/bench_crystal_schedules.py --mode=c --beta=0 --repeats=5

`methods.crystal_grpo.crystal_gradient` with `config.crystal.schedule` native / retain /
reweight (arXiv 2609.03528) on the same pretrained-shaped model, noise and batch
(configs/crystal_grpo.py:method=grpo: P = 4 groups × G = 16, T = 10 steps, |S| = 5). One JSON
line per schedule: `seconds` (median, after one warm-up), `speedup_vs_native` (measured in the
same run), `compile_seconds`, and the largest gradient difference to native relative to its
largest entry.
"""

import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags
from flax import nnx

from jaxrl_post.benchmarking import median_seconds
from jaxrl_post.config_args import load_module
from jaxrl_post.methods import crystal_grpo as cg
from jaxrl_post.sampling import flow_sde

ROOT = Path(__file__).resolve().parents[1]
_MODE = flags.DEFINE_enum("mode", "q", ["q", "c"], "CrystalGRPO mode.")
_BETA = flags.DEFINE_float("beta", 0.0, "Window KL coefficient (mode q).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per schedule.")
_RUNLOCAL = flags.DEFINE_bool("runlocal", False, "The runlocal config's shapes (tests).")


def main(argv):
  del argv
  arg = f"method=grpo,mode={_MODE.value}" + (",runlocal" if _RUNLOCAL.value else "")
  config = load_module(ROOT / "configs" / "crystal_grpo.py").get_config(arg)
  config.crystal.beta = _BETA.value
  config.crystal.beta_full = 0.0  # retain / reweight skip the forwards the full-path KL needs
  task, hp = cg.task_of(config), cg.settings_of(config.crystal)
  m = config.model
  model = cg.CrystalVelocity(task.num_atoms, hidden=m.hidden, depth=m.depth,
                             time_dim=m.time_dim, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  reference = jax.tree.map(lambda p: 1.01 * p, params)
  c = config.crystal
  batch = c.prompts_per_step * c.group_size
  x_init = jax.random.normal(jax.random.key(0), (batch, task.dim))
  noise = jax.random.normal(jax.random.key(1), (c.num_steps, batch, task.dim))
  grid = jax.numpy.asarray(flow_sde.time_grid(c.num_steps))
  flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])  # noqa: E731
  native = None
  for schedule in ("native", "retain", "reweight"):
    h = dataclasses.replace(hp, schedule=schedule)
    fn = jax.jit(lambda p, h=h: cg.crystal_gradient(p, reference, x_init, noise, grid,
                                                    graphdef=graphdef, task=task, hp=h))
    tic = time.perf_counter()
    compiled = fn.lower(params).compile()
    compile_seconds = time.perf_counter() - tic
    seconds = median_seconds(lambda c=compiled: jax.block_until_ready(c(params)),
                             _REPEATS.value)
    grads = flat(compiled(params).grads)
    row = {"what": "crystal_gradient", "schedule": schedule, "mode": hp.mode, "beta": hp.beta,
           "batch": batch, "steps": c.num_steps, "selected": len(hp.selected),
           "seconds": seconds, "compile_seconds": round(compile_seconds, 3)}
    if native is None:
      native = (seconds, grads)
    row["speedup_vs_native"] = native[0] / seconds
    row["max_grad_diff_rel"] = float(np.max(np.abs(grads - native[1]))
                                     / np.max(np.abs(native[1])))
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  app.run(main)
