"""MISA-T's central claim on the serving simulator (sampling.serving_sim, a PROPOSAL analogue).

  python scripts/misa_t_sim.py [--ticks 1000] [--seeds 0,1,2]

Sweeps static concurrency, then session admission, MISA and MISA-T; prints one JSON line per
(policy, cap, seed) and a summary line per setting (mean ± std over seeds) of complete samples
per tick, prefix-hit rate and consumed-vs-target TV; plots docs/misa_t_sim.png.
"""

import argparse
import dataclasses
import json

import matplotlib
import numpy as np

from jaxrl_post.sampling import serving_sim as sim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETTINGS = [("static", c) for c in (8, 12, 16, 24, 48)] + [
  ("session", 32), ("misa", 32), ("misa_t", 32)]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--ticks", type=int, default=1000)
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--plot", default="docs/misa_t_sim.png")
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  rows = []
  for policy, cap in SETTINGS:
    config = sim.SimConfig(ticks=args.ticks, cap=cap)
    results = [sim.simulate(config, policy, s) for s in seeds]
    for s, r in zip(seeds, results):
      print(json.dumps({"policy": policy, "cap": cap, "seed": s, **r._asdict()}))
    stats = {k: (float(np.mean([getattr(r, k) for r in results])),
                 float(np.std([getattr(r, k) for r in results])))
             for k in ("samples_per_tick", "hit_rate", "tv")}
    rows.append((f"{policy}" + (f"@{cap}" if policy == "static" else ""), stats))
    print(json.dumps({"summary": rows[-1][0], **{k: v for k, v in stats.items()},
                      "config": dataclasses.asdict(config)["ticks"]}))
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
  names = [n for n, _ in rows]
  for ax, key in zip(axes, ("samples_per_tick", "hit_rate", "tv")):
    ax.bar(names, [s[key][0] for _, s in rows], yerr=[s[key][1] for _, s in rows])
    ax.set_title(key)
    ax.tick_params(axis="x", rotation=60)
  fig.tight_layout()
  fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
  main()
