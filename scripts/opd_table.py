r"""Table and plots of a scripts/opd_reproduce.sh root (Open-MOPD miniature, arXiv 2608.19098).

  python scripts/opd_table.py /tmp/mopd --out=/tmp/mopd/table.md --plots=docs

Reads `<root>/route` (step-0 RouteRL and MixSFT evaluations), `<root>/<method>/seed<s>` and
`<root>/route_opd_<domain>`, and writes the paper's table in miniature: per-domain held-out
accuracy at the last step, Total (the mean over domains), headroom recovery
(Total − Total(MixSFT)) / (Total(RouteRL) − Total(MixSFT)), integration gap
Total(RouteOPD) − Total, and the token and gradient-budget shares per domain (mean over all
steps), each as mean ± std over seeds, plus the wall clock of every run. Plots:
`opd_domains.png` (per-domain accuracy during training, mean over seeds) and `opd_shares.png`
(per-domain token and budget shares during training).
"""

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402
from jaxrl_post.methods.opd import headroom_recovery  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_OUT = flags.DEFINE_string("out", None, "markdown table file (printed either way)",
                           flag_values=FLAGS)
_PLOTS = flags.DEFINE_string("plots", None, "directory for opd_domains.png, opd_shares.png",
                             flag_values=FLAGS)

DOMAINS = ("arith", "countdown", "format")
# The paper's ablation order: K = 1 rows, then the K = 4 matched controls, then Open-MOPD.
METHODS = ("naive", "token_share", "gap", "naive_k4", "share_gap_k4", "open_mopd")
LABELS = {"naive": "naive M-OPD", "token_share": "+ token-share", "gap": "+ gap-following",
          "naive_k4": "naive matched control (K = 4, no refresh)",
          "share_gap_k4": "+ share + gap (K = 4, no refresh)",
          "open_mopd": "Open-MOPD (+ refresh, 4 inner updates)"}


def _last(records, key):
  values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
  return values[-1] if values else float("nan")


def _first(records, key):
  values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
  return values[0] if values else float("nan")


def _mean_over_steps(records, key):
  values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
  return float(np.mean(values)) if values else float("nan")


def _runtime(run: Path) -> float:
  done = run / "DONE"
  return float(done.read_text()) if done.exists() else float("nan")


def _fmt(values, digits=3, percent=False):
  values = np.asarray([v for v in values if np.isfinite(v)], np.float64)
  if not values.size:
    return "—"
  scale, suffix = (100.0, " %") if percent else (1.0, "")
  if values.size == 1:
    return f"{scale * values[0]:.{digits}f}{suffix}"
  return f"{scale * values.mean():.{digits}f} ± {scale * values.std(ddof=1):.{digits}f}{suffix}"


def _curve(runs, key):
  by_step = defaultdict(list)
  for records in runs:
    for r in records:
      if isinstance(r.get(key), (int, float)):
        by_step[r["step"]].append(r[key])
  steps = sorted(by_step)
  return np.asarray(steps), np.asarray([np.mean(by_step[s]) for s in steps])


def collect(root: Path):
  """Everything the table needs, read from the metrics of the pipeline's runs."""
  route = read_metrics(root / "route")
  mixsft = {d: _first(route, f"eval/{d}/accuracy") for d in DOMAINS}
  routerl = {d: _first(route, f"route/{d}/accuracy") for d in DOMAINS}
  route_opd = {d: _last(read_metrics(root / f"route_opd_{d}"), f"eval/{d}/accuracy")
               if (root / f"route_opd_{d}").exists() else float("nan") for d in DOMAINS}
  methods = {}
  for method in METHODS:
    runs = sorted((p for p in (root / method).glob("seed*") if p.is_dir()),
                  key=lambda p: int(p.name[4:]))
    runs = [run for run in runs if (run / "DONE").exists()]
    if runs:
      methods[method] = {"runs": runs, "records": [read_metrics(run) for run in runs]}
  return dict(mixsft=mixsft, routerl=routerl, route_opd=route_opd, methods=methods,
              runtimes={"sft": _runtime(root / "sft"),
                        **{f"teacher_{d}": _runtime(root / f"teacher_{d}") for d in DOMAINS},
                        **{f"route_opd_{d}": _runtime(root / f"route_opd_{d}")
                           for d in DOMAINS}})


def table(data) -> str:
  mix_total = np.mean(list(data["mixsft"].values()))
  rl_total = np.mean(list(data["routerl"].values()))
  opd_total = np.mean(list(data["route_opd"].values()))
  head = ("| model | seeds | " + " | ".join(DOMAINS) + " | Total | headroom recovery | "
          "integration gap | token share (a / c / f) | budget share (a / c / f) | "
          "min per run |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]

  def reference(name, accuracies, total):
    cells = " | ".join(f"{accuracies[d]:.3f}" for d in DOMAINS)
    lines.append(f"| {name} | — | {cells} | {total:.3f} | | | | | |")

  reference("MixSFT (the student at step 0)", data["mixsft"], mix_total)
  reference("RouteRL (each domain by its GRPO teacher)", data["routerl"], rl_total)
  reference("RouteOPD (one single-teacher OPD student per domain)", data["route_opd"],
            opd_total)
  for method, info in data["methods"].items():
    per_seed = [{d: _last(rec, f"eval/{d}/accuracy") for d in DOMAINS} for rec in info["records"]]
    totals = [np.mean([s[d] for d in DOMAINS]) for s in per_seed]
    cells = " | ".join(_fmt([s[d] for s in per_seed]) for d in DOMAINS)
    recovery = [float(headroom_recovery(t, mix_total, rl_total)) for t in totals]
    gap = [opd_total - t for t in totals]
    shares = {kind: " / ".join(
      _fmt([_mean_over_steps(rec, f"domain/{d}/{kind}") for rec in info["records"]], 2)
      for d in DOMAINS) for kind in ("token_share", "budget_share")}
    minutes = [_runtime(run) / 60 for run in info["runs"]]
    lines.append(f"| {LABELS[method]} | {len(per_seed)} | {cells} | {_fmt(totals)} | "
                 f"{_fmt(recovery, 1, percent=True)} | {_fmt(gap)} | {shares['token_share']} | "
                 f"{shares['budget_share']} | {_fmt(minutes, 1)} |")
  run_times = ", ".join(f"{k} {v / 60:.1f}" for k, v in data["runtimes"].items()
                        if np.isfinite(v))
  return "\n".join(lines) + f"\n\nOther stages (minutes): {run_times}.\n"


def plots(data, out_dir: Path) -> None:
  methods = data["methods"]
  fig, axes = plt.subplots(1, len(DOMAINS) + 1, figsize=(4 * (len(DOMAINS) + 1), 3.2))
  for ax, key in zip(axes, [*(f"eval/{d}/accuracy" for d in DOMAINS), "eval/total"]):
    for method, info in methods.items():
      steps, values = _curve(info["records"], key)
      ax.plot(steps, values, marker="o", label=LABELS[method])
    name = key.split("/")[1]
    reference = (data["routerl"][name] if name in DOMAINS
                 else np.mean(list(data["routerl"].values())))
    ax.axhline(reference, color="k", linestyle="--", linewidth=1, label="RouteRL")
    ax.set_title(key)
    ax.set_xlabel("OPD step")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out_dir / "opd_domains.png", dpi=110)
  plt.close(fig)

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
  for ax, kind in zip(axes, ("token_share", "budget_share")):
    for method, info in methods.items():
      for d, style in zip(DOMAINS, ("-", "--", ":")):
        steps, values = _curve(info["records"], f"domain/{d}/{kind}")
        ax.plot(steps, values, style, label=f"{method} {d}",
                color=f"C{list(methods).index(method)}")
    ax.set_title(f"{kind} (solid arith, dashed countdown, dotted format)", fontsize=8)
    ax.set_xlabel("OPD step")
  axes[1].legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(out_dir / "opd_shares.png", dpi=110)
  plt.close(fig)


def main(argv: list[str]) -> None:
  """`argv`: the program name and the root."""
  if len(argv) != 2:
    raise app.UsageError(f"expected one root, got {argv[1:]}")
  data = collect(Path(argv[1]))
  text = table(data)
  print(text)
  if _OUT.value:
    Path(_OUT.value).write_text(text)
  if _PLOTS.value:
    Path(_PLOTS.value).mkdir(parents=True, exist_ok=True)
    plots(data, Path(_PLOTS.value))


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
