r"""Table and plots of a PCQA grid workdir (PCQA-R1 reproduction, arXiv 2608.18627).

  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py --workdir=/tmp/pcqa
  python scripts/pcqa_table.py --workdir=/tmp/pcqa --out=docs/pcqa

The grid's runs are `<workdir>/seed_<s>/<method>/`, each with the `final.json` of its last
evaluation (experiments/pcqa.py); `aggregate_runs` and `format_table` (also used by
scripts/pcqa_grid.py and scripts/pcqa_reeval.py) make the table.

Writes `<out>_table.md` (PLCC / SRCC per dataset, OOD and overall averages, mean ± std over
seeds; with a `capable=<n>` workdir its first row is the `capable` stage, the RL runs' start),
`<out>_bars.png` (ID vs OOD-average SRCC and PLCC per method) and `<out>_curves.png`
(OOD-average SRCC during training, and the GRPO rewards), and prints the table. With
`--reference`, the table ends with a row scoring the source's hidden quality q itself
(`hidden_quality_row`): what a model that learned the source panel perfectly would get on each
target; on the non-monotone shift (`shift=non_monotone`) it is the ceiling of "learn the source
well", and a method above it on a target has learned something the source's q does not say.
"""

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402
from jaxrl_post.rewards.quality_metrics import quality_metrics  # noqa: E402
from jaxrl_post.tasks import point_clouds  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_WORKDIR = flags.DEFINE_string("workdir", None, "the grid's workdir (scripts/pcqa_grid.py)",
                               flag_values=FLAGS, required=True)
_OUT = flags.DEFINE_string("out", None, "path prefix of the outputs", flag_values=FLAGS,
                           required=True)
_REFERENCE = flags.DEFINE_bool("reference", False, "append the source's hidden q as a row",
                               flag_values=FLAGS)

# "capable": the shared SFT stage the LM methods start from with `capable=<n>` (a row only when
# the workdir has it; `aggregate_runs` skips names without a final.json).
METHODS = ("capable", "sft", "rank", "rank_gauss", "full", "regression")
LABELS = {"capable": "capable start (SFT)", "sft": "SFT only", "rank": "ranking-only RL",
          "rank_gauss": "+ Gaussian",
          "full": "+ cold start (PCQA-R1)", "regression": "regression baseline"}


def correlations(final: Mapping[str, Any], datasets: Sequence[str]) -> dict[str, float]:
  """Per-dataset PLCC / SRCC of one run; an undefined correlation of a constant predictor is 0.

  A policy that writes the same score for every test sample (score std ≤ 1e-9: the float64
  std of identical values is ~4e-16, not 0) has no ranking ability, but its correlations are
  0/0 = NaN (or a meaningless fall-back of the logistic fit), which would drop it from every
  average; it counts as 0 instead, and `<dataset>/constant` says so. Other NaNs stay NaN.
  """
  out = {}
  for d in datasets:
    constant = final.get(f"{d}/score_std", 1.0) <= 1e-9
    out[f"{d}/constant"] = float(constant)
    for m in ("plcc", "srcc"):
      out[f"{d}/{m}"] = 0.0 if constant else final.get(f"{d}/{m}", float("nan"))
  return out


def aggregate_runs(workdir, methods: Sequence[str], datasets: Sequence[str], *,
                   source: str, filename: str = "final.json") -> dict[str, dict[str, Any]]:
  """Mean and std over seeds of each method's `final.json` under `workdir/seed_*/<method>/`.

  Per run, PLCC / SRCC per dataset (`correlations`: a constant predictor counts 0), their
  average over all datasets (`avg/…`) and over the targets other than `source` (`ood_avg/…`);
  then mean and population std over seeds. Also the unparseable and constant-prediction shares
  and the run time.

  Returns:
    `{method: {metric: [mean, std], "num_seeds": n}}`.
  """
  table: dict[str, dict[str, Any]] = {}
  for method in methods:
    finals = [json.loads(p.read_text())
              for p in sorted(Path(workdir).glob(f"seed_*/{method}/{filename}"))]
    if not finals:
      continue
    runs = []
    for final in finals:
      run = correlations(final, datasets)
      for name, chosen in (("avg", datasets), ("ood_avg", [d for d in datasets if d != source])):
        for m in ("plcc", "srcc"):
          run[f"{name}/{m}"] = float(np.mean([run[f"{d}/{m}"] for d in chosen]))
      for key in ["time/run", *(f"{d}/unparseable" for d in datasets)]:
        if key in final:
          run[key] = final[key]
      runs.append(run)
    row: dict[str, Any] = {"num_seeds": len(finals)}
    for key in runs[0]:
      values = [r[key] for r in runs if key in r]
      row[key] = [float(np.mean(values)), float(np.std(values))]
    table[method] = row
  return table


def hidden_quality_row(datasets: Sequence[str], *, source: str, test_size: int = 0,
                       num_points: int = 512) -> dict[str, Any]:
  """PLCC / SRCC of the hidden quality q (the source panel's rule) against each test MOS.

  The samples are those the runs evaluate (`point_clouds.make_sample` of the test split with
  the run's `num_points`; `test_size` 0: the dataset's size); q is deterministic, so the
  "std over seeds" is 0. Same keys as an `aggregate_runs` row (avg / ood_avg included).
  """
  row: dict[str, Any] = {"num_seeds": 1}
  for d in datasets:
    size = test_size or point_clouds.DATASETS.get(d).sizes["test"]
    samples = [point_clouds.make_sample(d, "test", i, num_points=num_points)
               for i in range(size)]
    m = quality_metrics([s.mos for s in samples], [s.quality for s in samples])
    row[f"{d}/plcc"], row[f"{d}/srcc"] = [float(m.plcc), 0.0], [float(m.srcc), 0.0]
  for name, chosen in (("avg", datasets), ("ood_avg", [d for d in datasets if d != source])):
    for metric in ("plcc", "srcc"):
      row[f"{name}/{metric}"] = [float(np.mean([row[f"{d}/{metric}"][0] for d in chosen])), 0.0]
  return row


def format_table(table: Mapping[str, Mapping[str, Any]], datasets: Sequence[str], *,
                 source: str) -> str:
  """A markdown table: PLCC / SRCC per dataset (mean ± std over seeds), OOD average."""
  cols = [f"{d}{' (ID)' if d == source else ''}" for d in datasets] + ["OOD avg", "all avg"]
  lines = ["| method | seeds | " + " | ".join(cols) + " |",
           "|---|---|" + "---|" * len(cols)]
  for method, row in table.items():
    cells = []
    for prefix in [*datasets, "ood_avg", "avg"]:
      p, s = row.get(f"{prefix}/plcc"), row.get(f"{prefix}/srcc")
      cells.append("–" if p is None else f"{p[0]:.3f}±{p[1]:.3f} / {s[0]:.3f}±{s[1]:.3f}")
    lines.append(f"| {method} | {row['num_seeds']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _curves(workdir: Path, method: str, key: str):
  """{step: [values over seeds]} of `key` in the method's metrics."""
  by_step = defaultdict(list)
  for run in sorted(workdir.glob(f"seed_*/{method}")):
    for record in read_metrics(run):
      if isinstance(record.get(key), (int, float)):
        by_step[record["step"]].append(record[key])
  steps = sorted(by_step)
  return np.asarray(steps), np.asarray([np.mean(by_step[s]) for s in steps])


def main(argv: list[str]) -> None:
  """Writes the table and the plots (flags only: `argv` is the program name)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  workdir, out = Path(_WORKDIR.value), _OUT.value
  config = json.loads(next(workdir.glob("seed_*/base/config.json")).read_text())
  datasets, source = config["datasets"].split(","), config["source"]
  table = aggregate_runs(workdir, METHODS, datasets, source=source)
  text = format_table(table, datasets, source=source)
  if _REFERENCE.value:
    reference = {"source's hidden q (reference)": hidden_quality_row(
      datasets, source=source, test_size=config.get("test_size", 0),
      num_points=config.get("num_points", 512))}
    text += "\n" + format_table(reference, datasets, source=source).splitlines()[-1]
  Path(f"{out}_table.md").write_text(text + "\n")
  print(text)
  for method, row in table.items():
    times = row.get("time/run", [float("nan")] * 2)
    unparse = [row.get(f"{d}/unparseable", [float("nan")])[0] for d in datasets]
    constant = [row.get(f"{d}/constant", [float("nan")])[0] for d in datasets]
    print(f"{method}: {times[0]:.0f}±{times[1]:.0f} s per run; unparseable share per dataset "
          f"{[round(u, 3) for u in unparse]}; share of seeds with a constant prediction "
          f"{[round(c, 2) for c in constant]}")

  methods = list(table)
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  x = np.arange(len(methods))
  for ax, metric in zip(axes, ("srcc", "plcc")):
    for offset, (prefix, name) in zip((-0.2, 0.2), ((source, f"in-domain ({source})"),
                                                   ("ood_avg", "cross-dataset average"))):
      mean = [table[m][f"{prefix}/{metric}"][0] for m in methods]
      std = [table[m][f"{prefix}/{metric}"][1] for m in methods]
      ax.bar(x + offset, mean, 0.4, yerr=std, capsize=3, label=name)
    ax.set_xticks(x, [LABELS[m] for m in methods], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(metric.upper())
    ax.axhline(0, color="k", lw=0.5)
    ax.set_title(f"{metric.upper()} (mean ± std over {table[methods[0]]['num_seeds']} seeds)")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(f"{out}_bars.png", dpi=110)

  fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
  for method in methods:
    steps, values = _curves(workdir, method, "eval/ood_avg/srcc")
    if len(steps):
      axes[0].plot(steps, values, marker="o", label=LABELS[method])
    steps, values = _curves(workdir, method, "reward/ranking")
    if len(steps):
      axes[1].plot(steps, values, label=LABELS[method])
  axes[0].set(xlabel="step of the run (GRPO, SFT or regression)",
              ylabel="cross-dataset SRCC", title="OOD-average SRCC during training")
  axes[1].set(xlabel="step", ylabel="mean r_rk", title="GRPO: Thurstone fidelity reward")
  for ax in axes:
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(f"{out}_curves.png", dpi=110)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
