r"""Table and plots of a scripts/opd_family_grid.sh root (the OPD-family comparison grid).

  python scripts/opd_family_table.py --root=/tmp/ofg --out=/tmp/ofg/table.md --plots=docs

Reads `<root>/runs/<method>_<teacher>/seed<s>` (teacher S = strong, W = weak, none), the
teachers' own runs (`<root>/quickstart/grpo`, `<root>/weak`) and the student's step-0
evaluation, and writes one row per method × teacher:

  * held-out greedy accuracy at the last step, mean ± std over seeds;
  * its gain over the student (step 0 of the same run), paired over the same prompts, mean
    over seeds, and the mean of the per-seed paired standard errors;
  * the paired difference to GRPO of the same seed at the last step (same prompts, same data
    order), mean ± std over seeds, and how many seeds it is > 0;
  * the accuracy at the mid-budget evaluation (the speed of the climb);
  * method diagnostics: TV-OPD's coefficient c_k at the first and last step, the mean
    |advantage|, minutes per run;

then the grid's questions (`QUESTIONS`) as paired differences between two rows, seed by seed,
and, for the OPRD rows that logged them, OPRD's first-order alignment diagnostics
(`OPRD_METRICS`, each averaged over a run's steps, then mean ± std over seeds). The footer gives
each teacher's accuracy and, for the weak teacher, the accuracy of its pre-RL reference (the
weak run's step-0 evaluation): the size of the RL shift OPRD's direction comes from.

Plots: `opd_family_accuracy.png` (held-out accuracy over steps, mean over seeds, per row),
`opd_family_tv.png` (TV-OPD's c_k and TV estimate over steps, per seed) and
`opd_family_oprd.png` (OPRD's aligned share and relative correction over steps, per row and
seed) when those rows ran.
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
from jaxrl_post.training.evaluation import paired_gain  # noqa: E402
from jaxrl_post.training.grid_report import curve, fmt, values  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_ROOT = flags.DEFINE_string("root", None, "the grid's root directory", flag_values=FLAGS,
                            required=True)
_OUT = flags.DEFINE_string("out", None, "markdown table file (printed either way)",
                           flag_values=FLAGS)
_PLOTS = flags.DEFINE_string("plots", None, "directory for the plots", flag_values=FLAGS)

TEACHERS = {"S": "strong", "W": "weak", "none": "—"}
ACC = "eval/accuracy"
# arXiv 2609.04108's Table 1 joint baselines (the grid's joint:<name>:S rows) and their names.
JOINT_LABELS = {"kdrl": "KDRL", "hdpo": "HDPO", "kdrl_mask": "KDRL-mask", "srpo": "SRPO",
                "trrd": "TRRD", "rlsd": "RLSD", "kdrl_annealing": "KDRL-annealing"}
# The grid's questions as paired comparisons (row, against row): last-step greedy accuracy on
# the same prompts, same seed.
QUESTIONS = (
  ("oprd_W", "grpo_none", "OPRD with a weak teacher vs GRPO"),
  ("oprd_W", "opd_W", "OPRD vs OPD, the same weak teacher"),
  ("oprd_W", "oprd_lambda0_W", "OPRD's correction (λ = 0.5 vs 0)"),
  ("tv_sign_S", "opd_S", "sign-only OPD vs raw OPD"),
  ("tv_opd_S", "opd_S", "TV-OPD vs raw OPD"),
  ("tv_opd_S", "tv_sign_S", "TV-OPD's coefficient c_k vs plain sign"),
  *(("opd_then_rl_S", f"joint_{name}_S", f"sequential OPD → GRPO vs {label} (joint)")
    for name, label in JOINT_LABELS.items()),
  ("opd_then_rl_S", "opd_S", "OPD → GRPO vs OPD throughout"),
  ("opdvr_W", "opd_W", "OPDVR's gate vs OPD, an often-wrong teacher"),
  ("opdvr_W", "grpo_none", "OPDVR with an often-wrong teacher vs GRPO"),
  ("tgopd_W", "grpo_none", "TGOPD (teacher probes gate OPD vs GRPO) vs GRPO, weak teacher"),
  ("grpd_W", "opdvr_W", "GRPD vs OPDVR, weak teacher"),
)


# OPRD's first-order alignment diagnostics (`losses.oprd_alignment_metrics`), logged every step.
OPRD_METRICS = {
  "oprd/aligned_frac": "aligned share (u ≥ 0)",
  "oprd/cos_abs_mean": "mean abs cos(d, g)",
  "oprd/rel_correction_mean": "relative correction (λ abs cos)",
  "oprd/active_frac": "corrected share of tokens",
}


def collect(root: Path) -> dict:
  """Every finished run of the grid (`grid_report.collect_runs`), the teachers' accuracy at
  their last evaluation and the weak teacher's at its first (its pre-RL reference)."""
  rows = grid_report.collect_runs(root)
  teachers = {}
  for name, path in (("strong", root / "quickstart" / "grpo"), ("weak", root / "weak")):
    acc = values(read_metrics(path), ACC) if path.exists() else []
    teachers[name] = acc[-1][1] if acc else float("nan")
    if name == "weak":
      teachers["weak_ref"] = acc[0][1] if len(acc) > 1 and acc[0][0] == 0 else float("nan")
  return {"rows": rows, "teachers": teachers}


def oprd_lines(rows: dict) -> list[str]:
  """The OPRD rows' alignment diagnostics: per run the mean over steps, then over seeds."""
  lines = []
  for row, seeds in rows.items():
    per_key = {k: [np.mean([v for _, v in values(run["records"], k)] or [np.nan])
                   for run in seeds.values()] for k in OPRD_METRICS}
    if all(np.isnan(per_key["oprd/aligned_frac"])):
      continue
    if not lines:
      head = "| row | seeds | " + " | ".join(OPRD_METRICS.values()) + " |"
      lines = [head, "|" + "---|" * (head.count("|") - 1)]
    method, teacher = _label(row)
    lines.append(f"| {method} ({teacher}) | {len(seeds)} | "
                 + " | ".join(fmt(per_key[k]) for k in OPRD_METRICS) + " |")
  return lines


def _label(row: str) -> tuple[str, str]:
  method, _, teacher = row.rpartition("_")
  return method.replace("joint_", "joint:"), TEACHERS.get(teacher, teacher)


def _last_step(outcomes) -> int:
  return max(outcomes)


def table(data: dict) -> str:
  rows = data["rows"]
  grpo = rows.get("grpo_none", {})
  head = ("| method | teacher | seeds | greedy acc. (last) | gain over student (paired SE) | "
          "− GRPO, paired (seeds > 0) | acc. at mid budget | c_k first → last | "
          "mean abs adv | min per run |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  student = [s["outcomes"][0]["greedy_correct"].mean() for r in rows.values() for s in r.values()
             if 0 in s["outcomes"]]
  for row, seeds in rows.items():
    method, teacher = _label(row)
    last, gains, ses, vs_grpo, mid, c_first, c_last, adv = ([] for _ in range(8))
    for seed, run in seeds.items():
      out = run["outcomes"]
      end = _last_step(out)
      last.append(float(np.mean(out[end]["greedy_correct"])))
      if 0 in out:
        gain, se = paired_gain(out[0]["greedy_correct"], out[end]["greedy_correct"])
        gains.append(gain)
        ses.append(se)
      if row != "grpo_none" and seed in grpo:
        g_out = grpo[seed]["outcomes"]
        vs_grpo.append(paired_gain(g_out[_last_step(g_out)]["greedy_correct"],
                                   out[end]["greedy_correct"])[0])
      evals = values(run["records"], ACC)
      middle = [v for s, v in evals if 0 < s < end]
      mid.append(middle[0] if middle else float("nan"))
      coef = values(run["records"], "distill/tv_coef")
      if coef:
        c_first.append(coef[0][1])
        c_last.append(coef[-1][1])
      adv.append(float(np.mean([v for _, v in values(run["records"], "distill/adv_abs_mean")]
                               or [np.nan])))
    wins = f" ({sum(v > 0 for v in vs_grpo)}/{len(vs_grpo)})" if vs_grpo else ""
    coef_cell = f"{fmt(c_first)} → {fmt(c_last)}" if c_first else ""
    lines.append(
      f"| {method} | {teacher} | {len(seeds)} | {fmt(last)} | "
      f"{fmt(gains, 1, 100, sign=True)} ({fmt(ses, 1, 100)}) | "
      f"{fmt(vs_grpo, 1, 100, sign=True) + wins if vs_grpo else ''} | {fmt(mid)} | "
      f"{coef_cell} | {fmt(adv, 3)} | {fmt([s['minutes'] for s in seeds.values()], 1)} |")
  lines += ["", *grid_report.question_lines(rows, QUESTIONS)]
  oprd = oprd_lines(rows)
  if oprd:
    lines += ["", "OPRD's alignment at the rollout policy (mean over steps; mean ± std over "
              "seeds):", "", *oprd]
  t = data["teachers"]
  weak_ref = t.get("weak_ref", float("nan"))
  lines.append("")
  lines.append(f"Student (step 0, greedy): {fmt(student[:1])}; strong teacher "
               f"{t['strong']:.3f}; weak teacher {t['weak']:.3f}"
               + (f", its pre-RL reference {weak_ref:.3f}" if np.isfinite(weak_ref) else "")
               + " (held-out greedy accuracy, each on its own run's evaluation set of the same "
               "size).")
  return "\n".join(lines) + "\n"


def plots(data: dict, out_dir: Path) -> None:
  out_dir.mkdir(parents=True, exist_ok=True)
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
  for row, seeds in data["rows"].items():
    method, teacher = _label(row)
    ax = axes[1] if teacher == "weak" else axes[0]
    steps, accs = curve(seeds, ACC)
    ax.plot(steps, accs, marker="o", label=method, linestyle="--" if method == "grpo" else "-")
    if method == "grpo":  # the baseline on both panels
      axes[1].plot(steps, accs, marker="o", label=method, linestyle="--")
  for ax, (title, teacher) in zip(axes, (("strong teacher (and GRPO)", "strong"),
                                         ("weak teacher (and GRPO)", "weak"))):
    ax.axhline(data["teachers"][teacher], color="k", linewidth=1, linestyle=":",
               label=f"{teacher} teacher")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
  axes[0].set_ylabel("held-out greedy accuracy (mean over seeds)")
  fig.tight_layout()
  fig.savefig(out_dir / "opd_family_accuracy.png", dpi=110)
  plt.close(fig)

  tv = data["rows"].get("tv_opd_S")
  if tv:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for seed, run in tv.items():
      for ax, key in zip(axes, ("distill/tv_coef", "distill/tv_estimate")):
        logged = values(run["records"], key)
        steps, ys = zip(*logged) if logged else ((), ())
        ax.plot(steps, ys, label=f"seed {seed}")
        ax.set_title(key)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "opd_family_tv.png", dpi=110)
    plt.close(fig)

  oprd = {row: seeds for row, seeds in data["rows"].items()
          if any(values(run["records"], "oprd/aligned_frac") for run in seeds.values())}
  if oprd:
    keys = ("oprd/aligned_frac", "oprd/rel_correction_mean")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for row, seeds in oprd.items():
      method, teacher = _label(row)
      for seed, run in seeds.items():
        for ax, key in zip(axes, keys):
          logged = values(run["records"], key)
          steps, ys = zip(*logged) if logged else ((), ())
          ax.plot(steps, ys, label=f"{method} ({teacher}) seed {seed}")
    for ax, key in zip(axes, keys):
      ax.set_title(OPRD_METRICS[key])
      ax.set_xlabel("step")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "opd_family_oprd.png", dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
  del argv
  data = collect(Path(_ROOT.value))
  text = table(data)
  print(text)
  if _OUT.value:
    Path(_OUT.value).write_text(text)
  if _PLOTS.value:
    plots(data, Path(_PLOTS.value))


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
