r"""Table and plot of a scripts/rl_family_grid.sh root (the RL-family comparison).

  python scripts/rl_family_table.py --root=/tmp/rlg --out=/tmp/rlg/table.md --plots=docs

Reads `<root>/runs/<row>/seed<s>` (`training.grid_report.collect_runs`) and writes one line per
row: held-out greedy accuracy at the last evaluation (mean ± std over seeds), its paired
difference to GRPO of the same seed on the same prompts (mean, seeds > 0), the area under the
accuracy curve (mean over the evaluations after step 0: TrajVal's time-averaged AUC), the first
step at which the row reaches GRPO's best accuracy of the same seed (TrajVal's "steps to the
baseline peak"), the replay and prior diagnostics, and minutes per run; then the grid's
questions (`QUESTIONS`) as paired differences, seed by seed; then the retention rows
(`retain_*`: trained on the mixture's arithmetic): each run's own change from step 0 on
arithmetic and on the retained domains, and `RETAIN_QUESTIONS` per domain.

Plots: `rl_family_accuracy.png`, held-out accuracy over steps (mean over seeds) per row, and
`rl_family_<group>.png` likewise for each row group that ran (e.g. `rl_family_cd_rft.png`).
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
_OUT = flags.DEFINE_string("out", None, "markdown table file (printed either way)",
                           flag_values=FLAGS)
_PLOTS = flags.DEFINE_string("plots", None, "directory for the plot", flag_values=FLAGS)

ACC = "eval/accuracy"
BASELINE = "grpo"
# Runs that serve other rows (TrajVal's probe), not rows of the table.
HELPER_RUNS = ("probe",)
QUESTIONS = (
  ("trajval", "grpo", "TrajVal's learnability prior vs uniform prompts"),
  ("headroom_drift", "grpo", "Headroom-Drift replay vs on-policy, same fresh batch"),
  ("headroom_drift", "matched", "Headroom-Drift replay vs on-policy, same update size"),
  ("headroom_drift", "naive_replay", "Headroom-Drift's gate and ranking vs naive replay"),
  ("naive_replay", "grpo", "naive replay vs on-policy, same fresh batch"),
)
# Retention rows: trained on the mixture's arithmetic, the other domains evaluated.
RETAIN_BASELINE = "retain_grpo"
RETAINED = ("countdown", "format")
RETAIN_QUESTIONS = (
  ("retain_gcpo", "retain_grpo", "GCPO vs GRPO"),
  ("retain_cokl", "retain_grpo", "CoKL vs GRPO (no KL)"),
  ("retain_cokl", "retain_rkl", "CoKL vs full-policy reverse KL"),
  ("retain_rkl", "retain_grpo", "reverse KL vs GRPO (no KL)"),
  ("retain_rapo", "retain_grpo", "RAPO's R-Scale (RLOO) vs GRPO"),
)
# Rows compared only with their own baselines, by name prefix: (title, questions, diagnostics
# averaged over steps then seeds). Reward-side rows run on 1-3 digit arithmetic (SIDE_STEPS).
GROUPS = {
  ("wmrl", "care"): (
    "Reward side (1-3 digit arithmetic)",
    (("wmrl", "wmrl_env", "WMRL vs GRPO on real rewards (every row verified)"),
     ("wmrl", "wmrl_raw", "WMRL vs the world model alone"),
     ("wmrl_raw", "wmrl_env", "the world model alone vs real rewards"),
     ("care", "care_static", "CARE's evolving rubrics vs the static rubric")),
    (("wmrl/env_rows", "verified rows / step"),
     ("wmrl/rwm_corr", "corr(r_wm, r)"),
     ("care/rubric_reward", "rubric reward"),
     ("care/true_accuracy", "rollouts' true accuracy"),
     ("care/hack_gap", "hack gap"))),
  ("rail",): (
    "Rollout interventions (RAIL; configs/rail.py's task)",
    (("rail", "rail_none", "RAIL vs GRPO (no extra rollouts)"),
     ("rail", "rail_heuristic", "RAIL's bandit vs the all-0/1 heuristic"),
     ("rail_heuristic", "rail_none", "heuristic vs GRPO"),
     ("rail_live", "rail_heuristic", "the bandit acting from the start vs the heuristic"),
     ("rail_live", "rail_none", "the bandit acting from the start vs GRPO"),
     ("rail_share", "rail_heuristic", "RAIL with the share switch (α = 0.1) vs the heuristic")),
    (("rail/interventions", "groups intervened / step"),
     ("rail/extra_tokens", "extra tokens / step"),
     ("rail/mixed_before", "mixed groups before"),
     ("rail/mixed_after", "mixed groups after"),
     ("rail/live", "controller live"),
     ("rail/controller_share", "controller's arms"),
     ("rail/window_share", "controller's wins, last 50"))),
  ("cd_rft",): (
    "Shared control (CD-RFT, the mixture)",
    (("cd_rft", "cd_rft_g0", "CD-RFT γ = 0.01 vs matched GRPO (γ = 0)"),
     ("cd_rft_g0.1", "cd_rft_g0", "CD-RFT γ = 0.1 vs matched GRPO (γ = 0)"),
     ("cd_rft_d0.003", "cd_rft_g0", "scaled penalty γ = 0.003 vs matched GRPO (γ = 0)"),
     ("cd_rft_d0.003", "cd_rft", "scaled penalty γ = 0.003 vs CD-RFT γ = 0.01")),
    (("train/cd_rft_scb", "SCB"),
     ("train/cd_rft_penalty", "penalty"),
     ("train/cd_rft_families", "families with a gradient"),
     ("train/grad_norm", "grad norm (before clip)"))),
}
DIAGNOSTICS = (("replay/accepted", "replayed groups / step"),
               ("replay/drift_accepted", "drift of replayed"),
               ("prior/learnable_fraction", "learnable fraction"))


def steps_to_reach(records, target: float) -> float:
  """The first evaluation step (after 0) whose accuracy is ≥ `target`; NaN if never."""
  for step, value in values(records, ACC):
    if step > 0 and value >= target - 1e-9:
      return float(step)
  return float("nan")


def retention_table(rows: dict) -> str:
  """Target gain and retained-domain change, each the run's own last − step 0 (paired over the
  same prompts), then the questions: row − baseline at the last evaluation, per domain."""
  head = ("| row | seeds | arith acc. (last) | arith, last − step 0 | " +
          " | ".join(f"{d}, last − step 0" for d in RETAINED) + " | min per run |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for row, seeds in rows.items():
    cells = []
    for key in ("greedy_correct", *(f"greedy_correct/{d}" for d in RETAINED)):
      cells.append(fmt([grid_report.change_from_start(run, key)[0] for run in seeds.values()],
                       1, 100, sign=True))
    last = [float(np.mean(grid_report.last_greedy(run))) for run in seeds.values()]
    lines.append(f"| {row} | {len(seeds)} | {fmt(last)} | " + " | ".join(cells) +
                 f" | {fmt([s['minutes'] for s in seeds.values()], 1)} |")
  lines += ["", "| question | arith (per seed; mean) | " +
            " | ".join(f"{d} (per seed; mean)" for d in RETAINED) + " |",
            "|---|---|" + "---|" * len(RETAINED)]
  for row, other, question in RETAIN_QUESTIONS:
    if row not in rows or other not in rows:
      continue
    cells = []
    for key in ("greedy_correct", *(f"greedy_correct/{d}" for d in RETAINED)):
      diffs, _ = grid_report.paired_rows(rows, row, other, key)
      cells.append(" / ".join(f"{100 * d:+.1f}" for d in diffs) +
                   f"; {fmt(diffs, 1, 100, sign=True)}")
    lines.append(f"| {question} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def group_table(rows: dict, questions, diagnostics) -> str:
  """Each row's last accuracy and its change from step 0, the method diagnostics (mean over
  steps, then over seeds), and `questions` as paired differences at the last evaluation."""
  head = ("| row | seeds | greedy acc. (last) | last − step 0 | " +
          " | ".join(d for _, d in diagnostics) + " | min per run |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for row, seeds in rows.items():
    last = [float(np.mean(grid_report.last_greedy(run))) for run in seeds.values()]
    gain = [grid_report.change_from_start(run)[0] for run in seeds.values()]
    diag = []
    for key, _ in diagnostics:
      per_seed = [float(np.nanmean([v for _, v in values(run["records"], key)]))
                  for run in seeds.values() if values(run["records"], key)]
      diag.append(fmt(per_seed, 3) if per_seed else "")
    lines.append(f"| {row} | {len(seeds)} | {fmt(last)} | {fmt(gain, 1, 100, sign=True)} | " +
                 " | ".join(diag) + f" | {fmt([s['minutes'] for s in seeds.values()], 1)} |")
  lines += ["", *grid_report.question_lines(rows, questions)]
  return "\n".join(lines) + "\n"


def table(rows: dict) -> str:
  retain = {k: v for k, v in rows.items() if k.startswith("retain_")}
  groups = [(spec, {k: v for k, v in rows.items() if k.startswith(prefixes)})
            for prefixes, spec in GROUPS.items()]
  grouped = set(retain).union(*(g for _, g in groups))
  rows = {k: v for k, v in rows.items() if k not in grouped}
  base = rows.get(BASELINE, {})
  head = ("| row | seeds | greedy acc. (last) | − GRPO, paired (seeds > 0) | AUC (evals > 0) | "
          "step reaching GRPO's best | " + " | ".join(d for _, d in DIAGNOSTICS) +
          " | min per run |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for row, seeds in rows.items():
    last, auc, reach, diag = [], [], [], {k: [] for k, _ in DIAGNOSTICS}
    for seed, run in seeds.items():
      last.append(float(np.mean(grid_report.last_greedy(run))))
      evals = [v for s, v in values(run["records"], ACC) if s > 0]
      auc.append(float(np.mean(evals)) if evals else float("nan"))
      if seed in base:
        best = max(v for s, v in values(base[seed]["records"], ACC) if s > 0)
        reach.append(steps_to_reach(run["records"], best))
      for key in diag:
        got = [v for _, v in values(run["records"], key)]
        if got:
          diag[key].append(float(np.mean(got)))
    vs, _ = grid_report.paired_rows(rows, row, BASELINE) if row != BASELINE else ([], [])
    wins = f" ({sum(v > 0 for v in vs)}/{len(vs)})" if vs else ""
    never = sum(np.isnan(reach))
    reach_cell = fmt(reach, 1) + (f" ({never} never)" if never else "")
    lines.append(
      f"| {row} | {len(seeds)} | {fmt(last)} | "
      f"{fmt(vs, 1, 100, sign=True) + wins if vs else ''} | {fmt(auc)} | {reach_cell} | " +
      " | ".join(fmt(diag[k], 3) if diag[k] else "" for k, _ in DIAGNOSTICS) +
      f" | {fmt([s['minutes'] for s in seeds.values()], 1)} |")
  lines += ["", *grid_report.question_lines(rows, QUESTIONS)]
  if not rows:  # only grouped rows ran: no empty main table
    lines = []
  if retain:
    lines += ["", "Retention (trained on arithmetic only; countdown and format evaluated):", "",
              retention_table(retain)]
  for (title, questions, diagnostics), group in groups:
    if group:
      lines += ["", f"{title}:", "", group_table(group, questions, diagnostics)]
  return "\n".join(lines).lstrip("\n") + "\n"


def _accuracy_plot(rows: dict, title: str, path: Path) -> None:
  fig, ax = plt.subplots(figsize=(6.5, 3.8))
  for row, seeds in rows.items():
    steps, accs = grid_report.curve(seeds, ACC)
    ax.plot(steps, accs, marker="o", label=row, linestyle="--" if row == BASELINE else "-")
  ax.set_xlabel("step")
  ax.set_ylabel("held-out greedy accuracy (mean over seeds)")
  ax.set_title(title)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plots(rows: dict, out_dir: Path) -> None:
  """`rl_family_accuracy.png` for the main rows, `rl_family_<group>.png` for each row group
  (named by its first prefix, e.g. `rl_family_cd_rft.png`); a plot only where rows ran."""
  out_dir.mkdir(parents=True, exist_ok=True)
  grouped = ("retain_", *(p for prefixes in GROUPS for p in prefixes))
  main_rows = {k: v for k, v in rows.items() if not k.startswith(grouped)}
  if main_rows:
    _accuracy_plot(main_rows, "RL family on the task mixture", out_dir / "rl_family_accuracy.png")
  for prefixes, (title, _, _) in GROUPS.items():
    group = {k: v for k, v in rows.items() if k.startswith(prefixes)}
    if group:
      _accuracy_plot(group, title, out_dir / f"rl_family_{prefixes[0]}.png")


def main(argv: list[str]) -> None:
  del argv
  rows = {k: v for k, v in grid_report.collect_runs(Path(_ROOT.value)).items()
          if k not in HELPER_RUNS}
  text = table(rows)
  print(text)
  if _OUT.value:
    Path(_OUT.value).write_text(text)
  if _PLOTS.value:
    plots(rows, Path(_PLOTS.value))


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
