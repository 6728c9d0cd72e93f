r"""MoE proxy reproduction, part (a): accuracy retention of expert-pruned proxies per selection.

Claim tested (arXiv 2608.10823 §3.4, secondary): clustering-selected proxies (three views +
K-Medoids) retain more of the original model's accuracy than frequency-only, and much more
than random or first-K selection. Synthetic analogue (spec §3.5, PROPOSAL): `qwen3_moe_tiny`
(16 experts, top-2, 2 layers) trained supervised on (a + b) mod 23, proxies with K ∈ {4, 8}.
Part (b), the fault-injection agreement of full vs proxy, is not written yet.

  python scripts/moe_proxy_faults.py --seeds 3 --steps 300

Prints one JSON line per (seed, K, selection) and writes docs/moe_proxy_retention.png.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models import moe_proxy as mp

MOD, EQ = 23, 24  # tokens 0..22 are numbers, 24 is "="


def _data(rng, n):
  a, b = rng.integers(0, MOD, n), rng.integers(0, MOD, n)
  return np.stack([a, b, np.full(n, EQ)], 1).astype(np.int32), ((a + b) % MOD).astype(np.int32)


def _accuracy(model, x, y):
  return float(jnp.mean(jnp.argmax(jax.jit(lambda m, t: m(t))(model, x)[:, -1], -1) == y))


def train(seed, steps):
  model = CausalLM(get_model_config("qwen3_moe_tiny", vocab_size=32), rngs=nnx.Rngs(seed))
  opt = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  rng = np.random.default_rng(seed)

  @nnx.jit
  def step(model, opt, x, y):
    def loss(m):
      return optax.softmax_cross_entropy_with_integer_labels(m(x)[:, -1], y).mean()
    value, grads = nnx.value_and_grad(loss)(model)
    opt.update(model, grads)
    return value

  for _ in range(steps):
    step(model, opt, *map(jnp.asarray, _data(rng, 256)))
  return model


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--plot", default="docs/moe_proxy_retention.png")
  args = parser.parse_args()
  grid = np.stack(np.meshgrid(np.arange(MOD), np.arange(MOD)), -1).reshape(-1, 2)
  x_all = jnp.asarray(np.concatenate([grid, np.full((len(grid), 1), EQ)], 1), jnp.int32)
  y_all = jnp.asarray(grid.sum(1) % MOD, jnp.int32)
  results = {}
  for seed in range(args.seeds):
    tic = time.time()
    model = train(seed, args.steps)
    full = _accuracy(model, x_all, y_all)
    calib = jnp.asarray(_data(np.random.default_rng(1000 + seed), 128)[0])  # disjoint draw
    print(json.dumps(dict(seed=seed, k=16, selection="full", accuracy=full,
                          train_s=round(time.time() - tic, 1))), flush=True)
    for k in (4, 8):
      for selection in ("kmedoids", "frequency", "random", "first_k"):
        proxy, keep = mp.build_moe_proxy(model, calib, k, selection=selection, seed=seed)
        acc = _accuracy(proxy, x_all, y_all)
        results.setdefault((k, selection), []).append(acc / max(full, 1e-9))
        print(json.dumps(dict(seed=seed, k=k, selection=selection, accuracy=acc,
                              retention=acc / max(full, 1e-9),
                              kept=[list(map(int, x)) for x in keep])), flush=True)
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3.5))
  sels = ("kmedoids", "frequency", "random", "first_k")
  for i, k in enumerate((4, 8)):
    means = [np.mean(results[(k, s)]) for s in sels]
    stds = [np.std(results[(k, s)]) for s in sels]
    ax.bar(np.arange(4) + 0.4 * i, means, 0.4, yerr=stds, label=f"K={k} of 16")
  ax.set_xticks(np.arange(4) + 0.2, sels)
  ax.set_ylabel("accuracy retention (proxy / full)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(args.plot, dpi=120)
  for (k, s), v in sorted(results.items()):
    print(json.dumps(dict(summary=True, k=k, selection=s, mean=float(np.mean(v)),
                          std=float(np.std(v)), n=len(v))))


if __name__ == "__main__":
  main()
