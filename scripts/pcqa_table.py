r"""Table and plots of an experiments/pcqa.py workdir (PCQA-R1 reproduction, arXiv 2608.18627).

  python scripts/pcqa_table.py --workdir=/tmp/pcqa --out=docs/pcqa

Writes `<out>_table.md` (PLCC / SRCC per dataset, OOD and overall averages, mean ± std over
seeds; with a `capable=<n>` workdir its first row is the `capable` stage, the RL runs' start),
`<out>_bars.png` (ID vs OOD-average SRCC and PLCC per method) and `<out>_curves.png`
(OOD-average SRCC during training, and the GRPO rewards), and prints the table.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_post.training import pcqa  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

# "capable": the shared SFT stage the LM methods start from with `capable=<n>` (a row only when
# the workdir has it; `aggregate_runs` skips names without a final.json).
METHODS = ("capable", "sft", "rank", "rank_gauss", "full", "regression")
LABELS = {"capable": "capable start (SFT)", "sft": "SFT only", "rank": "ranking-only RL",
          "rank_gauss": "+ Gaussian",
          "full": "+ cold start (PCQA-R1)", "regression": "regression baseline"}


def _curves(workdir: Path, method: str, key: str):
  """{step: [values over seeds]} of `key` in the method's metrics."""
  by_step = defaultdict(list)
  for run in sorted(workdir.glob(f"seed_*/{method}")):
    for record in read_metrics(run):
      if isinstance(record.get(key), (int, float)):
        by_step[record["step"]].append(record[key])
  steps = sorted(by_step)
  return np.asarray(steps), np.asarray([np.mean(by_step[s]) for s in steps])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True, help="path prefix of the outputs")
  args = parser.parse_args()
  workdir = Path(args.workdir)
  config = json.loads(next(workdir.glob("seed_*/base/config.json")).read_text())
  datasets, source = config["datasets"].split(","), config["source"]
  table = pcqa.aggregate_runs(workdir, METHODS, datasets, source=source)
  text = pcqa.format_table(table, datasets, source=source)
  Path(f"{args.out}_table.md").write_text(text + "\n")
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
  fig.savefig(f"{args.out}_bars.png", dpi=110)

  fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
  for method in methods:
    steps, values = _curves(workdir, method, "eval/ood_avg/srcc")
    if len(steps):
      axes[0].plot(steps, values, marker="o", label=LABELS[method])
    steps, values = _curves(workdir, method, "reward/ranking")
    if len(steps):
      axes[1].plot(steps, values, label=LABELS[method])
  axes[0].set(xlabel="step (cold start + GRPO, or SFT / regression)",
              ylabel="cross-dataset SRCC", title="OOD-average SRCC during training")
  axes[1].set(xlabel="step", ylabel="mean r_rk", title="GRPO: Thurstone fidelity reward")
  for ax in axes:
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(f"{args.out}_curves.png", dpi=110)


if __name__ == "__main__":
  main()
