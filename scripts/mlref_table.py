r"""Tables and a plot of an experiments/mlref.py workdir (MLREF, arXiv 2608.18827).

  python scripts/mlref_table.py /tmp/mlref --plot=docs/mlref_cartpole.png

Reads `<workdir>/fitness.jsonl` (one line per method, pipeline and iteration) and prints, per
method, mean ± std over pipelines of

* the best-so-far fitness after each iteration (what the loop would hand back);
* the round-best fitness of each iteration (the best variant proposed in that round), whose
  spread across iterations is the paper's stability question;

and a stability summary per method: the mean over pipelines of the round-to-round standard
deviation of the round-best, the share of rounds that fell below the round before
(oscillation), the share of rounds that set a new best, and the final best-so-far. The plot
has best-so-far and round-best per iteration (mean ± std over pipelines).
"""

import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_PLOT = flags.DEFINE_string("plot", None, "PNG path (default: <workdir>/mlref_fitness.png).",
                            flag_values=FLAGS)

ORDER = ("mlref", "monolithic", "no_pool", "llm_weights_only", "env_reward")
LABELS = {"mlref": "MLREF (pool + hybrid credit)", "monolithic": "monolithic (edits R*)",
          "no_pool": "no pool (edits R*)", "llm_weights_only": "LLM weights only",
          "env_reward": "PPO on the env reward (reference)"}


def load(workdir: Path) -> dict[str, np.ndarray]:
  """method → `[pipelines, iterations, 2]` array of (round_best, best_so_far); NaN if missing."""
  rows = [json.loads(line) for line in (workdir / "fitness.jsonl").read_text().splitlines()
          if line.strip()]
  if not rows:
    raise ValueError(f"{workdir / 'fitness.jsonl'} is empty")
  by_method: dict[str, dict[tuple[int, int], tuple[float, float]]] = defaultdict(dict)
  for r in rows:
    by_method[r["method"]][(r["pipeline"], r["iteration"])] = (
        float(r["round_best"]), float(r["best_so_far"]))
  out = {}
  for method, cells in by_method.items():
    pipelines = sorted({p for p, _ in cells})
    iterations = sorted({i for _, i in cells})
    arr = np.full((len(pipelines), len(iterations), 2), np.nan)
    for (p, i), values in cells.items():
      arr[pipelines.index(p), iterations.index(i)] = values
    out[method] = arr
  return out


def stability(round_best: np.ndarray) -> dict[str, float]:
  """Stability of `[pipelines, iterations]` round-best fitness (mean over pipelines).

  Returns:
    round_std: std over iterations of the round-best, averaged over pipelines.
    drop_rate: share of rounds i ≥ 2 with round_best[i] < round_best[i − 1].
    new_best_rate: share of rounds i ≥ 2 that beat every earlier round.
    late: `[pipelines]` mean round-best over the second half of the iterations (where an
      oscillating method has fallen back and a steadily improving one has not).
  """
  rb = np.asarray(round_best, float)
  late = np.nanmean(rb[:, rb.shape[1] // 2:], axis=1)
  if rb.shape[1] < 2:
    return {"round_std": float("nan"), "drop_rate": float("nan"),
            "new_best_rate": float("nan"), "late": late}
  drops = rb[:, 1:] < rb[:, :-1]
  running = np.maximum.accumulate(rb, axis=1)
  new_best = rb[:, 1:] > running[:, :-1]
  return {"round_std": float(np.nanmean(np.nanstd(rb, axis=1))),
          "drop_rate": float(drops.mean()), "new_best_rate": float(new_best.mean()),
          "late": late}


def _cell(values) -> str:
  values = np.asarray(values, float)
  values = values[np.isfinite(values)]
  return f"{values.mean():.1f} ± {values.std():.1f}" if len(values) else "–"


def tables(results: dict[str, np.ndarray]) -> str:
  methods = [m for m in ORDER if m in results] + sorted(set(results) - set(ORDER))
  iterations = max(results[m].shape[1] for m in methods)
  head = "| method | " + " | ".join(f"it. {i + 1}" for i in range(iterations)) + " |"
  rule = "|---|" + "---:|" * iterations
  lines = []
  for title, index in (("Best-so-far fitness (mean ± std over pipelines):", 1),
                       ("Round-best fitness, the best variant of each round:", 0)):
    lines += [title, "", head, rule]
    for m in methods:
      arr = results[m][:, :, index]
      cells = [_cell(arr[:, i]) if i < arr.shape[1] else "–" for i in range(iterations)]
      lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    lines.append("")
  lines += ["Stability (mean over pipelines): std of the round-best across rounds, share of "
            "rounds below the round before, share of rounds that set a new best, mean "
            "round-best over the second half of the rounds (mean ± std over pipelines); final "
            "best-so-far per pipeline:", "",
            "| method | pipelines | round-to-round std | drops | new bests | late rounds "
            "| final best-so-far |", "|---|---:|---:|---:|---:|---:|---|"]
  for m in methods:
    final = ", ".join(f"{v:.1f}" for v in results[m][:, -1, 1])
    if m == "env_reward":  # One PPO run repeated per iteration: no rounds to compare.
      lines.append(f"| {LABELS[m]} | {results[m].shape[0]} | – | – | – | – | {final} |")
      continue
    s = stability(results[m][:, :, 0])
    lines.append(f"| {LABELS.get(m, m)} | {results[m].shape[0]} | {s['round_std']:.1f} | "
                 f"{s['drop_rate']:.2f} | {s['new_best_rate']:.2f} | {_cell(s['late'])} | "
                 f"{final} |")
  return "\n".join(lines)


def plot(results: dict[str, np.ndarray], path: Path) -> None:
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
  for ax, index, title in ((axes[0], 1, "best-so-far"), (axes[1], 0, "round-best")):
    for m in [m for m in ORDER if m in results]:
      arr = results[m][:, :, index]
      its = np.arange(1, arr.shape[1] + 1)
      mean, std = np.nanmean(arr, axis=0), np.nanstd(arr, axis=0)
      if m == "env_reward":
        ax.axhline(mean[0], color="k", linestyle="--", label=LABELS[m])
        continue
      ax.plot(its, mean, marker="o", label=LABELS[m])
      ax.fill_between(its, mean - std, mean + std, alpha=0.15)
    ax.set_title(f"{title} fitness (mean ± std over pipelines)", fontsize=9)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("true episodic return")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str]) -> None:
  """`argv`: the program name and the workdir."""
  if len(argv) != 2:
    raise app.UsageError(f"expected one workdir, got {argv[1:]}")
  workdir = Path(argv[1])
  results = load(workdir)
  print(tables(results))
  path = Path(_PLOT.value) if _PLOT.value else workdir / "mlref_fitness.png"
  plot(results, path)
  print(f"plot: {path}")


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
