r"""Table and plot of a scripts/multiturn_grid.sh root: multi-turn arms from one cold start.

  python scripts/multiturn_table.py --root=/tmp/tgrpo_kv --baseline=turn_grpo \
      --out=/tmp/tgrpo_kv/table.md --plot=docs/temporal_grpo_kv.png

Reads `<root>/runs/<arm>/seed<s>` (experiments/rtpo.py run directories: `metrics.jsonl`,
per-episode `eval_outcomes/` with `greedy_success` and `sampled_success`, `DONE`) and writes:

  * per arm: held-out sampled success (the policy's own pass@1 at the training temperature) at
    step 0 and at the last evaluation, greedy success likewise (mean ± std over seeds), its
    own change in sampled success paired over the same episodes (mean paired SE in brackets),
    the RL steps the budget allowed, the generated tokens and minutes per run, and the means
    over steps of the `--metrics` (e.g. a method's diagnostics);
  * every arm against `--baseline`, seed by seed, on the same held-out episodes: the paired
    difference in sampled and in greedy success at the last evaluation.

The plot: sampled success, mean over seeds (`sampled_curve`), one line per arm, over RL steps or
(`--plot_x=tokens`) over generated tokens, the axis on which arms that spend different rollouts
per step (group sizes, say) are compared at an equal budget.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402
from jaxrl_post.training import grid_report  # noqa: E402
from jaxrl_post.training.grid_report import fmt, values  # noqa: E402

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_ROOT = flags.DEFINE_string("root", None, "the grid's root directory", flag_values=FLAGS,
                            required=True)
_BASELINE = flags.DEFINE_string("baseline", None, "the arm every other is compared with",
                                flag_values=FLAGS, required=True)
_METRICS = flags.DEFINE_list("metrics", [], "training metrics to average over steps",
                             flag_values=FLAGS)
_OUT = flags.DEFINE_string("out", None, "markdown table file (printed either way)",
                           flag_values=FLAGS)
_PLOT = flags.DEFINE_string("plot", None, "PNG of sampled success (x axis: --plot_x)",
                            flag_values=FLAGS)
_PLOT_X = flags.DEFINE_enum("plot_x", "step", ["step", "tokens"],
                            "the plot's x axis: RL steps or generated tokens", flag_values=FLAGS)

SAMPLED, GREEDY = "sampled_success", "greedy_success"


def _at(run: dict, key: str, first: bool) -> float:
  outcomes = run["outcomes"]
  if not outcomes:
    return float("nan")
  step = min(outcomes) if first else max(outcomes)
  if first and step != 0 or key not in outcomes[step]:
    return float("nan")
  return float(np.mean(outcomes[step][key]))


def _span(runs, key: str) -> str:
  """`first → last` of outcomes `key`, each mean ± std over the runs."""
  return f"{fmt([_at(r, key, True) for r in runs])} → {fmt([_at(r, key, False) for r in runs])}"


def table(rows: dict, baseline: str, metrics=()) -> str:
  """The per-arm table and the paired comparisons with `baseline` (markdown)."""
  if baseline not in rows:
    raise ValueError(f"--baseline={baseline!r} has no finished run; arms: {', '.join(rows)}")
  head = ("| arm | seeds | sampled success, step 0 → last | greedy success, step 0 → last | "
          "own change in sampled, paired (SE) | RL steps | generated tokens | min per run |"
          + "".join(f" {m} |" for m in metrics))
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for arm, seeds in rows.items():
    runs = list(seeds.values())
    change = [grid_report.change_from_start(run, SAMPLED) for run in runs]
    train = [[r for r in run["records"] if "budget/step_tokens" in r] for run in runs]
    tokens = [t[-1]["budget/generated_tokens"] if t else np.nan for t in train]
    means = [fmt([np.mean([v for _, v in values(run["records"], m)] or [np.nan]) for run in runs])
             for m in metrics]
    lines.append(
      f"| {arm} | {len(runs)} | {_span(runs, SAMPLED)} | {_span(runs, GREEDY)} | "
      f"{fmt([c[0] for c in change], 1, 100, sign=True)} ({fmt([c[1] for c in change], 1, 100)}) | "
      f"{fmt([len(t) for t in train], 1)} | {fmt(tokens, 0)} | "
      f"{fmt([s['minutes'] for s in runs], 1)} |" + "".join(f" {m} |" for m in means))
  lines += ["", f"Against {baseline}, seed by seed on the same held-out episodes (points; "
            "paired SE of one seed ≈ the last column):", "",
            "| arm | sampled: per seed | mean ± std | seeds > 0 | greedy: per seed | mean ± std "
            "| mean paired SE (sampled) |", "|---|---|---|---|---|---|---|"]
  for arm in rows:
    if arm == baseline:
      continue
    diffs, ses = grid_report.paired_rows(rows, arm, baseline, SAMPLED)
    greedy, _ = grid_report.paired_rows(rows, arm, baseline, GREEDY)
    lines.append(
      f"| {arm} | {' / '.join(f'{100 * d:+.1f}' for d in diffs)} | "
      f"{fmt(diffs, 1, 100, sign=True)} | {sum(d > 0 for d in diffs)}/{len(diffs)} | "
      f"{' / '.join(f'{100 * d:+.1f}' for d in greedy)} | {fmt(greedy, 1, 100, sign=True)} | "
      f"{fmt(ses, 1, 100)} |")
  return "\n".join(lines) + "\n"


def sampled_curve(seeds: dict, x: str = "step") -> tuple[list[float], list[float]]:
  """Held-out sampled success, mean over seeds, at the steps every seed evaluated and at the
  seeds' last evaluations (a budget stops seeds at different steps; averaging a step only some
  seeds logged would jump between seeds). x: the step, or (`x="tokens"`) the generated tokens
  by then (`budget/generated_tokens`, the last value logged at or before the step; 0 before
  the first), each a mean over the seeds."""
  evals = [dict(values(run["records"], "eval/sampled_success")) for run in seeds.values()]
  spent = [values(run["records"], "budget/generated_tokens") for run in seeds.values()]

  def at(i: int, step: int) -> float:
    return float(step) if x == "step" else max([v for s, v in spent[i] if s <= step] or [0.0])

  common = sorted(set.intersection(*(set(e) for e in evals)))
  lasts = [max(e) for e in evals]
  common = [s for s in common if s < min(lasts)]
  xs = [float(np.mean([at(i, s) for i in range(len(evals))])) for s in common]
  ys = [float(np.mean([e[s] for e in evals])) for s in common]
  xs.append(float(np.mean([at(i, s) for i, s in enumerate(lasts)])))
  ys.append(float(np.mean([e[s] for e, s in zip(evals, lasts)])))
  return xs, ys


def plot(rows: dict, path: Path, x: str = "step") -> None:
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for arm, seeds in rows.items():
    xs, ys = sampled_curve(seeds, x)
    ax.plot(xs, ys, marker="o", label=arm)
  ax.set_xlabel("RL step" if x == "step" else "generated tokens (mean over seeds)")
  ax.set_ylabel("held-out sampled success (mean over seeds)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str]) -> None:
  del argv
  rows = grid_report.collect_runs(Path(_ROOT.value))
  if not rows:
    raise ValueError(f"no finished runs under {_ROOT.value}/runs")
  text = table(rows, _BASELINE.value, _METRICS.value)
  print(text)
  if _OUT.value:
    Path(_OUT.value).write_text(text)
  if _PLOT.value:
    plot(rows, Path(_PLOT.value), _PLOT_X.value)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
