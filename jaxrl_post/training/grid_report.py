"""Reading a comparison grid's runs back: per-row, per-seed metrics and paired comparisons.

A grid (scripts/*_grid.sh) writes `<root>/runs/<row>/seed<s>/` run directories, each with
`metrics.jsonl`, `eval_outcomes/` (per-prompt greedy correctness at each evaluation) and `DONE`
(its wall-clock seconds) once finished. The table scripts (scripts/*_table.py) read them with
`collect_runs` and compare two rows seed by seed on the same held-out prompts with
`paired_rows` (`training.evaluation.paired_gain`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from jaxrl_post.training.evaluation import paired_gain
from jaxrl_post.training.metrics import read_eval_outcomes, read_metrics


def values(records, key: str) -> list[tuple[int, float]]:
  """`(step, value)` of metric `key` where it was logged as a number."""
  return [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]


def fmt(vals, digits: int = 3, scale: float = 1.0, sign: bool = False) -> str:
  """`mean ± std` (ddof 1) of the finite values × `scale`; one value alone; "—" for none."""
  vals = np.asarray([v for v in vals if np.isfinite(v)], np.float64) * scale
  if not vals.size:
    return "—"
  spec = f"{'+' if sign else ''}.{digits}f"
  if vals.size == 1:
    return format(vals[0], spec)
  return f"{format(vals.mean(), spec)} ± {vals.std(ddof=1):.{digits}f}"


def run_minutes(run: Path) -> float:
  """Wall-clock minutes of a finished run (its `DONE` file), NaN if unknown."""
  try:
    return float((run / "DONE").read_text()) / 60
  except (OSError, ValueError):
    return float("nan")


def collect_runs(root: Path) -> dict[str, dict[int, dict]]:
  """Every finished run under `root/runs`: `{row: {seed: {"records", "outcomes", "minutes"}}}`."""
  rows: dict[str, dict[int, dict]] = {}
  for row_dir in sorted(p for p in (Path(root) / "runs").glob("*") if p.is_dir()):
    seeds = {}
    for run in row_dir.glob("seed*"):
      if (run / "DONE").exists():
        seeds[int(run.name[4:])] = {"records": read_metrics(run),
                                    "outcomes": read_eval_outcomes(run),
                                    "minutes": run_minutes(run)}
    if seeds:
      rows[row_dir.name] = dict(sorted(seeds.items()))
  return rows


def last_greedy(run: dict, key: str = "greedy_correct") -> np.ndarray:
  """Per-prompt outcomes `key` (default greedy correctness; `greedy_correct/<task>` for an
  `eval_tasks` entry) at a run's last evaluation."""
  outcomes = run["outcomes"]
  return outcomes[max(outcomes)][key]


def paired_rows(rows: dict, row: str, other: str, key: str = "greedy_correct"
                ) -> tuple[list[float], list[float]]:
  """Seed by seed, `row` − `other` at the last evaluation, paired over the same prompts:
  `(differences, standard errors)` for the seeds both rows have."""
  diffs, ses = [], []
  for seed in sorted(set(rows.get(row, {})) & set(rows.get(other, {}))):
    gain, se = paired_gain(last_greedy(rows[other][seed], key), last_greedy(rows[row][seed], key))
    diffs.append(gain)
    ses.append(se)
  return diffs, ses


def change_from_start(run: dict, key: str = "greedy_correct") -> tuple[float, float]:
  """A run's own last-minus-step-0 change of outcomes `key`, paired over the same prompts."""
  outcomes = run["outcomes"]
  if 0 not in outcomes or key not in outcomes[0]:
    return float("nan"), float("nan")
  return paired_gain(outcomes[0][key], last_greedy(run, key))


def curve(seeds: dict, key: str) -> tuple[list[int], list[float]]:
  """Metric `key` over steps, mean over the seeds that logged it at each step."""
  by_step = defaultdict(list)
  for run in seeds.values():
    for step, value in values(run["records"], key):
      by_step[step].append(value)
  steps = sorted(by_step)
  return steps, [float(np.mean(by_step[s])) for s in steps]


def question_lines(rows: dict, questions) -> list[str]:
  """A markdown table of `(row, other, question)` comparisons: `row` − `other` at the last
  evaluation, paired over the same prompts, per seed, their mean ± std, the seeds > 0 and the
  mean paired SE (points). Questions whose rows did not run are left out."""
  lines = ["| question | difference, points (per seed) | mean ± std | seeds > 0 | "
           "mean paired SE |", "|---|---|---|---|---|"]
  for row, other, question in questions:
    if row not in rows or other not in rows:
      continue
    diffs, ses = paired_rows(rows, row, other)
    per_seed = " / ".join(f"{100 * d:+.1f}" for d in diffs)
    lines.append(f"| {question} | {per_seed} | {fmt(diffs, 1, 100, sign=True)} | "
                 f"{sum(d > 0 for d in diffs)}/{len(diffs)} | {fmt(ses, 1, 100)} |")
  return lines
