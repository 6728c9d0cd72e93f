r"""RTPO's success-vs-horizon grid (arXiv 2608.18682): run it, then tabulate and plot it.

  python scripts/rtpo_horizon.py --config=configs/rtpo_kv.py --root=/tmp/rtpo_kv             # run
  python scripts/rtpo_horizon.py --config=configs/rtpo_kv.py --root=/tmp/rtpo_kv --dry_run   # print
  python scripts/rtpo_horizon.py --root=/tmp/rtpo_kv --summarize      # table + PNG

For every horizon K and seed: a cold-start SFT run (`method=sft`) in `<root>/k<K>/s<seed>/sft`,
then each method from it in `<root>/k<K>/s<seed>/<method>`, all at the config's generated-token
budget for that K. `--init_from=<dir with {seed}>` replaces the per-(K, seed) SFT by one shared
cold start per seed. `--jobs=N` runs N (K, seed) cells side by side (a `tiny` run keeps about
one core busy), each cell's runs in order, with every run's output in `<workdir>.log`. Each run
resumes from its checkpoint, so the script can be stopped and started again (a finished run
only re-prints its summary).

`--methods` may name `VARIANTS` too (`rtpo_offpolicy`: RTPO with off-policy continuations).
`--summarize` reads every run's step-0 and final held-out evaluations (greedy `eval/success`,
sampled `eval/sampled_success`), its generated tokens, wall clock and mean training/rollout
probability ratio (`train/consistency_ratio`), and prints markdown tables (mean ± std over
seeds) plus RTPO's relative gains, then writes `<root>/success_vs_horizon.png`.
"""

import concurrent.futures
import shlex
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxrl_post.training.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("flat_grpo", "turn_grpo", "rtpo")
# Grid entries that are a method with fixed flags: RTPO's off-policy-continuation ablation
# (arXiv 2608.18682, §4), siblings sampled by θ_0 and weighted by the clamped ω̄.
VARIANTS = {"rtpo_offpolicy": ("rtpo", ("--config.continuation=off_policy",))}

_CONFIG = flags.DEFINE_string("config", "configs/rtpo_kv.py", "The env's rtpo config file.")
_ROOT = flags.DEFINE_string("root", None, "Directory of the grid's workdirs.")
_HORIZONS = flags.DEFINE_list("horizons", ["2", "4", "6", "8"], "Horizons K.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
_METHODS = flags.DEFINE_list("methods", list(METHODS), "RL methods, or variants: "
                             f"{', '.join(VARIANTS)}.")
_INIT_FROM = flags.DEFINE_string(
  "init_from", "", "Start every method from this checkpoint directory instead of an SFT run "
  "per (K, seed); '{seed}' is replaced by the seed (one shared cold start per seed).")
_EXTRA = flags.DEFINE_string("extra", "", "Further flags for every run, e.g. '--config.x=1'.")
_JOBS = flags.DEFINE_integer("jobs", 1, "(K, seed) cells run side by side.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands without running them.")
_SUMMARIZE = flags.DEFINE_bool("summarize", False, "Tabulate and plot instead of running.")
flags.mark_flag_as_required("root")


def commands(config: str, root: Path, horizons, seeds, methods, extra: str,
             init_from: str = "") -> list[list[str]]:
  """The grid's command lines, SFT before the methods that start from it.

  With `init_from` (a path template with '{seed}'), no SFT runs are made: every method of a
  seed starts from that seed's shared cold start, whatever K.
  """
  out = []
  binary = [sys.executable, str(ROOT / "experiments" / "rtpo.py")]
  for k in horizons:
    for seed in seeds:
      base = root / f"k{k}" / f"s{seed}"
      start = init_from.format(seed=seed) if init_from else str(base / "sft")
      for method in methods if init_from else ("sft", *methods):
        # A variant runs its method with its flags, in a workdir named after the variant.
        name, flags_ = VARIANTS.get(method, (method, ()))
        command = [*binary, f"--config={config}:method={name},horizon={k},seed={seed}",
                   f"--workdir={base / method}", *flags_]
        if method != "sft":
          command.append(f"--config.init_from={start}")
        out.append(command + shlex.split(extra))
  return out


def _final(workdir: Path) -> dict | None:
  """The first and last evaluation of a run, its budget, wall clock and consistency ratio."""
  records = read_metrics(workdir)
  evals = [r for r in records if "eval/success" in r]
  if not evals:
    return None
  first, last = evals[0], evals[-1]
  ratios = [r["train/consistency_ratio"] for r in records if "train/consistency_ratio" in r]
  return {"success": last["eval/success"], "step": last["step"],
          "sampled": last.get("eval/sampled_success", float("nan")),
          "start": first["eval/success"] if first["step"] == 0 else float("nan"),
          "start_sampled": (first.get("eval/sampled_success", float("nan"))
                            if first["step"] == 0 else float("nan")),
          "consistency": float(np.mean(ratios)) if ratios else float("nan"),
          "tokens": last.get("budget/generated_tokens", 0),
          "wall": max((r.get("time/wall", 0.0) for r in records), default=0.0)}


def _finite(runs, key) -> np.ndarray:
  values = np.array([r[key] for r in runs], dtype=float)
  return values[np.isfinite(values)]


def _mean_std(runs, key) -> str:
  values = _finite(runs, key)
  return f"{values.mean():.3f} ± {values.std():.3f}" if len(values) else "–"


def _mean(runs, key) -> float:
  values = _finite(runs, key)
  return float(values.mean()) if len(values) else float("nan")


def summarize(root: Path) -> str:
  """Markdown tables of final success per (K, method), cost, consistency, relative gains; plots.

  `start` is the step-0 evaluation of the RL runs (the cold start's success at that K), so a
  grid with a shared cold start still shows where each K began.
  """
  results: dict[tuple[int, str], list[dict]] = {}
  for run in sorted(root.glob("k*/s*/*")):
    final = _final(run) if (run / "metrics.jsonl").exists() else None
    if final is not None:
      results.setdefault((int(run.parent.parent.name[1:]), run.name), []).append(final)
  if not results:
    raise ValueError(f"no finished runs under {root}")
  horizons = sorted({k for k, _ in results})
  methods = [m for m in ("sft", *METHODS, *VARIANTS) if any((k, m) in results for k in horizons)]
  rl = [m for m in methods if m != "sft"]
  lines = ["Greedy success (mean ± std over seeds):", "",
           "| K | start | " + " | ".join(methods) + " |", "|---|---:|" + "---:|" * len(methods)]
  for k in horizons:
    starts = [r for m in rl for r in results.get((k, m), [])]
    cells = [f"{_mean_std(runs, 'success')} (n={len(runs)})" if runs else "–"
             for runs in (results.get((k, m), []) for m in methods)]
    lines.append(f"| {k} | {_mean_std(starts, 'start')} | " + " | ".join(cells) + " |")
  lines += ["", "Sampled success at the training temperature:", "",
            "| K | start | " + " | ".join(rl) + " |", "|---|---:|" + "---:|" * len(rl)]
  for k in horizons:
    starts = [r for m in rl for r in results.get((k, m), [])]
    cells = [_mean_std(results.get((k, m), []), "sampled") if (k, m) in results else "–"
             for m in rl]
    lines.append(f"| {k} | {_mean_std(starts, 'start_sampled')} | " + " | ".join(cells) + " |")
  lines += ["", "Cost and consistency (mean over seeds): generated tokens, wall clock, "
            "training/rollout probability ratio:", "",
            "| K | " + " | ".join(rl) + " |", "|---|" + "---|" * len(rl)]
  for k in horizons:
    cells = []
    for m in rl:
      runs = results.get((k, m), [])
      cells.append(f"{_mean(runs, 'tokens') / 1e3:.0f}k tok, {_mean(runs, 'wall') / 60:.1f} min, "
                   f"ratio {_mean(runs, 'consistency'):.3f}" if runs else "–")
    lines.append(f"| {k} | " + " | ".join(cells) + " |")
  if "rtpo" in rl and len(rl) > 1:
    # The paper's headline gains are (RTPO − baseline) / vanilla, vanilla being the policy RL
    # starts from (2608.18682 §2.6); the plain ratio RTPO / baseline − 1 is given next to it.
    others = [m for m in rl if m != "rtpo"]
    lines += ["", "RTPO's gain on mean sampled success, (RTPO − baseline) / start (the paper's "
              "convention) / (RTPO − baseline) / baseline:", "",
              "| K | " + " | ".join(f"vs {m}" for m in others) + " |",
              "|---|" + "---:|" * len(others)]
    for k in horizons:
      ours = _mean(results.get((k, "rtpo"), []), "sampled") if (k, "rtpo") in results else np.nan
      start = _mean([r for m in rl for r in results.get((k, m), [])], "start_sampled")
      cells = []
      for m in others:
        base = _mean(results.get((k, m), []), "sampled") if (k, m) in results else np.nan
        cells.append(f"{100 * (ours - base) / start:+.1f} % / {100 * (ours - base) / base:+.1f} %"
                     if base > 0 and start > 0 and ours == ours else "–")
      lines.append(f"| {k} | " + " | ".join(cells) + " |")

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  for ax, key, label in ((axes[0], "success", "held-out greedy success"),
                         (axes[1], "sampled", "held-out sampled success (train T)")):
    for m in methods:
      ks = [k for k in horizons if (k, m) in results]
      means = [_mean(results[(k, m)], key) for k in ks]
      stds = [np.nanstd([r[key] for r in results[(k, m)]]) for k in ks]
      ax.errorbar(ks, means, yerr=stds, marker="o", capsize=3, label=m)
    start_key = "start" if key == "success" else "start_sampled"
    starts = [_mean([r for m in rl for r in results.get((k, m), [])], start_key)
              for k in horizons]
    ax.plot(horizons, starts, "k--", marker="x", label="start (step 0)")
    ax.set_xlabel("horizon K (tool calls)")
    ax.set_ylabel(label)
    ax.set_xticks(horizons)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(root / "success_vs_horizon.png", dpi=110)
  plt.close(fig)
  return "\n".join(lines)


def _run_cell(cell: list[list[str]], log_to_file: bool) -> None:
  for command in cell:
    print(shlex.join(command), flush=True)
    if not log_to_file:
      subprocess.run(command, check=True, cwd=ROOT)
      continue
    workdir = Path(next(a for a in command if a.startswith("--workdir=")).split("=", 1)[1])
    workdir.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{workdir}.log", "a") as log:
      subprocess.run(command, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def main(argv):
  del argv
  root = Path(_ROOT.value)
  if _SUMMARIZE.value:
    print(summarize(root))
    print(f"plot: {root / 'success_vs_horizon.png'}")
    return
  grid = commands(_CONFIG.value, root, _HORIZONS.value, _SEEDS.value, _METHODS.value,
                  _EXTRA.value, _INIT_FROM.value)
  if _DRY_RUN.value:
    for command in grid:
      print(shlex.join(command))
    return
  cells: dict[str, list[list[str]]] = {}
  for command in grid:  # A cell is one (K, seed): its SFT must finish before its methods.
    workdir = next(a for a in command if a.startswith("--workdir="))
    cells.setdefault(str(Path(workdir).parent), []).append(command)
  with concurrent.futures.ThreadPoolExecutor(max(_JOBS.value, 1)) as pool:
    for future in [pool.submit(_run_cell, cell, _JOBS.value > 1) for cell in cells.values()]:
      future.result()


if __name__ == "__main__":
  app.run(main)
