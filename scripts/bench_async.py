r"""GRPO with synchronous, one-step-off and fully asynchronous rollouts: step time and reward.

  python scripts/bench_async.py --init_from=/tmp/sft --steps=30 --seeds=0,1,2 \
      --out=/tmp/bench_async                      # docs/benchmarks.md, "Asynchronous rollouts"
  python scripts/bench_async.py --config=configs/grpo_arith.py:runlocal --steps=3 \
      --out=/tmp/ba --devices=2                    # smoke run (tests/scripts)

Each mode trains the same config (`--config`, default configs/grpo_arith.py, from
`--init_from`) for `--steps` steps, in one process with `--devices` single-threaded CPU
devices (`parallel.host.use_one_cpu_device_per_core`): with 2, the sampler gets one device and
the trainer the other (`config.mesh.sampler_devices=1`), so generation and update can overlap
on the two cores (with XLA's intra-op thread pool on, both would compete for both cores).
Modes: `sync`, `one_step_off` and `async` (`max_in_flight=2`) recompute `old_logp` with the
trainer; the two asynchronous ones correct the staleness with truncated importance sampling on
the sampler's log-probs (`config.loss.sampler_correction="truncate"`, cap 2). The
`*_sampler_logp` modes take the sampler's log-probs as `old_logp` instead
(`config.rollout.old_logp="sampler"`: no scoring pass) and compare with each other. The
`*_process` modes sample in a separate process (`config.rollout.sampler_process`) with one
single-threaded device, the trainer's process training on its first device.
Prints JSON lines:

  {"what": "matmul_peak", ...}                       # in-run reference
  {"what": "async_rollouts", "mode", "seed", "steps", "median_step_s", "steps_per_hour",
   "wall_s", "final_reward", "eval_accuracy", "staleness": {"0": n, "1": n, ...},
   "wait_rollout_s", "weight_sync_s"}
  {"what": "async_speedup", "mode", "reference", "steps_per_hour_ratio", "final_reward_diff"}

and writes each run's per-step curve (`step`, `wall_s`, `reward`) to `--out/curves.jsonl`
and the plot `--out/async_rollouts.png` (reward against steps and against wall time).
`median_step_s` is the median of the steps after the first two (compilation).
"""

import json
import time
from pathlib import Path

import ml_collections
import numpy as np
from absl import app, flags

from jaxrl_post.benchmarking import matmul_peak
from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.parallel import host
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
MODES = {
  "sync": dict(mode="sync"),
  "one_step_off": dict(mode="one_step_off"),
  "async": dict(mode="async", max_in_flight=2),
  # The sampler's log-probs as old_logp: no scoring pass (Miles' --use-rollout-logprobs).
  "sync_sampler_logp": dict(mode="sync", old_logp="sampler"),
  "one_step_off_sampler_logp": dict(mode="one_step_off", old_logp="sampler"),
  # The sampler in a process of its own (`sampling.sampler_process`): it inherits XLA_FLAGS
  # (single-threaded) and has JAX's one CPU device by default, the other core.
  "one_step_off_process": dict(mode="one_step_off", sampler_process=True),
  "async_process": dict(mode="async", max_in_flight=2, sampler_process=True),
}

_CONFIG = flags.DEFINE_string("config", str(ROOT / "configs" / "grpo_arith.py"),
                              "Experiment config (file[:arg]).")
_INIT = flags.DEFINE_string("init_from", "", "Starting policy (an SFT run directory).")
_STEPS = flags.DEFINE_integer("steps", 30, "GRPO steps per run.")
_SEEDS = flags.DEFINE_string("seeds", "0", "Comma-separated seeds.")
_MODES = flags.DEFINE_string("modes", ",".join(MODES), "Comma-separated modes.")
_OUT = flags.DEFINE_string("out", "/tmp/bench_async", "Run directories, curves and plot.")
_DEVICES = flags.DEFINE_integer(
  "devices", 2, "Single-threaded CPU devices, one per core (`parallel.host`); with 2 the "
  "sampler and the trainer get one each.")
_EVAL = flags.DEFINE_integer("eval_examples", 64, "Held-out prompts of the final evaluation.")


def _config(mode: str, seed: int, devices: int):
  path, _, arg = _CONFIG.value.partition(":")
  config = load_module(path).get_config(arg or None)
  config.unlock()
  config.seed, config.steps = seed, _STEPS.value
  config.eval_every, config.eval_at_start = _STEPS.value, False
  config.eval_examples = min(config.eval_examples, _EVAL.value)
  config.checkpoint_every, config.log_every = _STEPS.value, 1
  config.optimizer.decay_steps = _STEPS.value
  if _INIT.value:
    config.init_from = _INIT.value
  if devices > 1:
    config.mesh.sampler_devices = 1
  config.rollout = ml_collections.ConfigDict(MODES[mode])
  if MODES[mode]["mode"] != "sync" and MODES[mode].get("old_logp") != "sampler":
    config.loss.sampler_correction = "truncate"
    config.loss.sampler_max = 2.0
  return config


def _run(mode: str, seed: int, devices: int, out: Path) -> tuple[dict, list[dict]]:
  workdir = out / f"{mode}_s{seed}"
  config = _config(mode, seed, devices)
  method = GRPO(config)
  stamps = []
  step = method.step

  def timed(state, i):  # the wall clock at the end of each step (the loop's own order)
    result = step(state, i)
    stamps.append(time.perf_counter())
    return result

  method.step = timed
  tic = time.perf_counter()
  loop.train(config, workdir, method)
  wall = time.perf_counter() - tic
  records = [r for r in read_metrics(workdir) if "train/loss" in r]
  evals = [r for r in read_metrics(workdir) if "eval/accuracy" in r]
  durations = np.diff([tic, *stamps])
  steady = durations[2:] if len(durations) > 2 else durations
  stale = [int(r.get("rollout/staleness_max", 0)) for r in records]
  last = records[-min(5, len(records)):]
  summary = {
    "what": "async_rollouts", "mode": mode, "seed": seed, "steps": len(records),
    "devices": devices, "median_step_s": float(np.median(steady)),
    "steps_per_hour": 3600.0 / float(np.median(steady)), "wall_s": wall,
    "final_reward": float(np.mean([r["train/reward_correct"] for r in last])),
    "eval_accuracy": float(evals[-1]["eval/accuracy"]) if evals else None,
    "staleness": {str(k): stale.count(k) for k in sorted(set(stale))},
    "wait_rollout_s": float(np.median([r.get("time/wait_rollout", 0.0) for r in records])),
    "weight_sync_s": float(np.median([r.get("time/weight_sync", 0.0) for r in records])),
  }
  curve = [{"mode": mode, "seed": seed, "step": r["step"], "wall_s": float(t - tic),
            "reward": r["train/reward_correct"]} for r, t in zip(records, stamps)]
  return summary, curve


def _plot(curves: list[dict], path: Path, window: int = 5) -> None:
  """Reward (mean over seeds, `window`-step running mean) against steps and wall clock."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  colors = {"sync": "tab:blue", "one_step_off": "tab:orange", "async": "tab:green",
            "sync_sampler_logp": "tab:purple", "one_step_off_sampler_logp": "tab:red",
            "one_step_off_process": "tab:brown", "async_process": "tab:olive"}
  for mode in dict.fromkeys(c["mode"] for c in curves):
    seeds = sorted({c["seed"] for c in curves if c["mode"] == mode})
    runs = [[c for c in curves if c["mode"] == mode and c["seed"] == s] for s in seeds]
    steps = min(len(r) for r in runs)
    reward = np.mean([[c["reward"] for c in r[:steps]] for r in runs], axis=0)
    wall = np.mean([[c["wall_s"] for c in r[:steps]] for r in runs], axis=0)
    smooth = np.convolve(reward, np.ones(window) / window, mode="valid")
    x_step = np.arange(window, steps + 1)
    for ax, x in zip(axes, (x_step, wall[window - 1:])):
      ax.plot(x, smooth, color=colors.get(mode), label=f"{mode} ({len(seeds)} seeds)")
  axes[0].set_xlabel("step")
  axes[1].set_xlabel("wall clock since start (s, mean over seeds)")
  for ax in axes:
    ax.set_ylabel(f"train reward, {window}-step mean")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  host.use_one_cpu_device_per_core(_DEVICES.value)  # before JAX's first computation
  import jax

  out = Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  devices = len(jax.devices())
  print(json.dumps(matmul_peak(n=1024)), flush=True)
  summaries, curves = [], []
  for seed in [int(s) for s in _SEEDS.value.split(",")]:
    for mode in _MODES.value.split(","):
      if mode not in MODES:
        raise ValueError(f"--modes: unknown mode {mode!r}; valid: {', '.join(MODES)}")
      summary, curve = _run(mode, seed, devices, out)
      print(json.dumps(summary), flush=True)
      summaries.append(summary)
      curves.extend(curve)
  with open(out / "curves.jsonl", "w") as f:
    for row in curves:
      f.write(json.dumps(row) + "\n")
  for mode in {s["mode"] for s in summaries} - {"sync", "sync_sampler_logp"}:
    reference = "sync_sampler_logp" if mode.endswith("_sampler_logp") else "sync"
    base = [s for s in summaries if s["mode"] == reference]
    runs = [s for s in summaries if s["mode"] == mode]
    if base:
      print(json.dumps({
        "what": "async_speedup", "mode": mode, "reference": reference,
        "steps_per_hour_ratio": float(np.mean([s["steps_per_hour"] for s in runs])
                                      / np.mean([s["steps_per_hour"] for s in base])),
        "final_reward_diff": float(np.mean([s["final_reward"] for s in runs])
                                   - np.mean([s["final_reward"] for s in base]))}), flush=True)
  _plot(curves, out / "async_rollouts.png", window=min(5, _STEPS.value))


if __name__ == "__main__":
  app.run(main)
