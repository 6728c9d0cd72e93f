r"""Held-out greedy accuracy per domain of a grid's runs on a task mixture.

  python scripts/domain_accuracy.py --root=/tmp/rlg_cd --out=/tmp/rlg_cd/domains.md

A mixture run logs one `eval/accuracy` over its held-out prompts, which mixes the domains; the
per-prompt outcomes (`eval_outcomes/`, `greedy_correct`) keep them apart. This script rebuilds
the run's held-out prompts exactly as the GRPO evaluator chose them (`methods.grpo.
fitting_indices` on the run's own config.json), reads each prompt's domain
(`MixtureTask.domain_of`), and writes, per row and domain: accuracy at step 0 and at the last
evaluation (mean ± std over seeds) and the change, paired over the same prompts per seed (its
mean ± std).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from absl import flags

from jaxrl_post import script_flags
from jaxrl_post.methods.grpo import fitting_indices
from jaxrl_post.tasks.mixture import MixtureTask
from jaxrl_post.training import grid_report, run_dir, setup
from jaxrl_post.training.grid_report import fmt

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_ROOT = flags.DEFINE_string("root", None, "the grid's root directory", flag_values=FLAGS,
                            required=True)
_OUT = flags.DEFINE_string("out", None, "markdown table file (printed either way)",
                           flag_values=FLAGS)


def prompt_domains(workdir: str | Path) -> np.ndarray:
  """The domain of each held-out prompt of the run in `workdir`, in evaluation order.

  Raises:
    ValueError: the run's task is not a mixture (its records carry no domain).
  """
  config = run_dir.read_config(workdir)
  tokenizer = setup.build_tokenizer(config)
  task = setup.build_task(config, tokenizer)
  if not isinstance(task, MixtureTask):
    raise ValueError(f"{workdir}: config.task={config.task!r} is not a mixture (its prompts "
                     "carry no domain)")
  indices = fitting_indices(config, task, tokenizer, "test", config.eval_examples,
                            "config.task")
  return np.asarray([task.domain_of(task.make_example("test", i)) for i in indices])


def _first_and_last(row: str, seeds: dict, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """Each seed's per-prompt greedy outcomes at step 0 and at its last evaluation."""
  pairs = []
  for seed, run in seeds.items():
    outcomes = run["outcomes"]
    if 0 not in outcomes:
      continue
    first, last = outcomes[0]["greedy_correct"], outcomes[max(outcomes)]["greedy_correct"]
    if len(first) != size:
      raise ValueError(f"{row}/seed{seed} evaluated {len(first)} prompts, not the {size} of "
                       "the grid's first run: the rows must share config.eval_examples and the "
                       "task")
    pairs.append((first, last))
  return pairs


def table(rows: dict, domains: np.ndarray) -> str:
  """Markdown: per row and domain, step 0 → last accuracy and the paired change (points)."""
  names = sorted(set(domains.tolist()))
  counts = ", ".join(f"{d} {int((domains == d).sum())}" for d in names)
  lines = [f"Held-out prompts per domain: {counts}.", "",
           "| row | seeds | " + " | ".join(f"{d}: step 0 → last | {d}: change (pts)"
                                           for d in names) + " |",
           "|---|---|" + "---|---|" * len(names)]
  for row, seeds in rows.items():
    pairs = _first_and_last(row, seeds, len(domains))
    cells = []
    for d in names:
      mask = domains == d
      first = [float(np.mean(f[mask])) for f, _ in pairs]
      last = [float(np.mean(la[mask])) for _, la in pairs]
      change = np.subtract(last, first)
      cells.append(f"{fmt(first)} → {fmt(last)} | {fmt(change, 1, 100, sign=True)}")
    lines.append(f"| {row} | {len(seeds)} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  del argv
  root = Path(_ROOT.value)
  rows = grid_report.collect_runs(root)
  if not rows:
    raise ValueError(f"no finished runs under {root}/runs")
  first_run = next(p for p in sorted((root / "runs").glob("*/seed*")) if (p / "DONE").exists())
  text = table(rows, prompt_domains(first_run))
  print(text)
  if _OUT.value:
    Path(_OUT.value).write_text(text)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
