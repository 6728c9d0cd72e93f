r"""CrystalGRPO (arXiv 2608.06582) on toy crystals: energy-only reward vs Q vs C, matched budgets.

  python scripts/crystal_grpo_modes.py --root=/tmp/crystal_grpo_repro --seeds=3

Per seed: flow-matching pretraining on the A2B2 polymorphs (configs/crystal_grpo.py:
method=pretrain), then from it three GRPO runs with the same budget (steps × groups × G samples,
the same rollout noise): `energy` (mode q, R = R_E), `q` (mode q, R = R_match + w_E·R_E) and `c`
(mode c: coverage advantage + KL to the pretrained policy over all T steps). Each run's
evaluation at its last step (16 trials × 20 ODE samples from fixed noise): MR@1, MR@20, RMSE of
the matched (1 sample / best of 20), distinct polymorphs per 20, the lowest-energy polymorph's
share. The questions: does energy-only collapse onto the lowest-energy polymorph
(p0; the target is p1) and lose Top-20; does Q raise Top-1; does C keep Top-20?

One JSON line per run, then one per mode (mean ± std over seeds), all saved to
`<root>/results.json`; the plot (MR@1, MR@20, RMSE of matched, distinct polymorphs, p0 share per
mode, mean ± std) goes to `--plot` (`--replot` redraws it from results.json).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import matplotlib
from absl import flags

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402
from jaxrl_post.config_args import load_module  # noqa: E402
from jaxrl_post.methods.crystal_grpo import CrystalGRPO  # noqa: E402
from jaxrl_post.training import loop  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FLAGS = flags.FlagValues()
_ROOT = flags.DEFINE_string("root", "/tmp/crystal_grpo_repro", "Workdirs of the runs.",
                            flag_values=FLAGS)
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds.", flag_values=FLAGS)
_MODES = flags.DEFINE_string("modes", "energy,q,c", "GRPO runs per seed.", flag_values=FLAGS)
_PRETRAIN_STEPS = flags.DEFINE_integer("pretrain_steps", 0, "0: the config's.",
                                       flag_values=FLAGS)
_STEPS = flags.DEFINE_integer("steps", 0, "GRPO steps; 0: the config's.", flag_values=FLAGS)
_PLOT = flags.DEFINE_string("plot", str(ROOT / "docs" / "crystal_grpo_modes.png"),
                            "Output plot.", flag_values=FLAGS)
_REPLOT = flags.DEFINE_bool("replot", False, "Only redraw the plot from <root>/results.json.",
                            flag_values=FLAGS)

KEYS = ("eval/mr1", "eval/mr_top", "eval/rmse1", "eval/rmse_top", "eval/basins",
        "eval/share_p0", "eval/share_p1", "eval/energy_median", "eval/kl_pretrained")


def _run(arg: str, workdir: Path, **overrides) -> dict:
  config = load_module(ROOT / "configs" / "crystal_grpo.py").get_config(arg)
  config.update(overrides)
  config.eval_at_start = True
  loop.train(config, workdir, CrystalGRPO(config))
  evals = [r for r in read_metrics(workdir) if "eval/mr1" in r]
  return {"first": {k: evals[0][k] for k in KEYS}, "last": {k: evals[-1][k] for k in KEYS},
          "step": evals[-1]["step"]}


def _plot(summary: dict, seeds: int) -> None:
  names = list(summary)
  panels = (("eval/mr1", "MR@1 (target p1)", 1.05), ("eval/mr_top", "MR@20 (target p1)", 1.05),
            ("eval/rmse1", "RMSE of matched, 1 sample", None),
            ("eval/basins", "distinct polymorphs / 20", 3.15),
            ("eval/share_p0", "share of lowest-energy p0", 1.05))
  fig, axes = plt.subplots(1, len(panels), figsize=(17, 3.4))
  for ax, (key, label, top) in zip(axes, panels):
    means = [summary[n][key][0] for n in names]
    stds = [summary[n][key][1] for n in names]
    ax.bar(names, means, yerr=stds, capsize=4,
           color=["grey", "tab:red", "tab:blue", "tab:green"][:len(names)])
    if top:
      ax.set_ylim(0, top)
    ax.set_title(label)
  fig.suptitle(f"CrystalGRPO toy crystals (A2B2, target p1), mean ± std over {seeds} seeds")
  fig.tight_layout()
  Path(_PLOT.value).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(_PLOT.value, dpi=110)
  print(json.dumps({"plot": _PLOT.value}), flush=True)


def main(argv) -> None:
  del argv
  root = Path(_ROOT.value)
  if _REPLOT.value:
    saved = json.loads((root / "results.json").read_text())
    _plot(saved["summary"], saved["seeds"])
    return
  modes = [m for m in _MODES.value.split(",") if m]
  results: dict[str, list[dict]] = {"pretrained": []}
  results.update({m: [] for m in modes})
  tic = time.perf_counter()
  for seed in range(_SEEDS.value):
    pre = root / f"s{seed}" / "pretrain"
    over = {"steps": _PRETRAIN_STEPS.value} if _PRETRAIN_STEPS.value else {}
    out = _run(f"method=pretrain,seed={seed}", pre, **over)
    results["pretrained"].append(out["last"])
    print(json.dumps({"seed": seed, "run": "pretrained", **out["last"]}), flush=True)
    for mode in modes:
      over = {"steps": _STEPS.value} if _STEPS.value else {}
      out = _run(f"method=grpo,mode={mode},seed={seed}", root / f"s{seed}" / mode,
                 init_from=str(pre), **over)
      results[mode].append(out["last"])
      print(json.dumps({"seed": seed, "run": mode, "step": out["step"], **out["last"]}),
            flush=True)
  summary = {}
  for name, runs in results.items():
    row = {}
    for k in KEYS:
      vals = [r[k] for r in runs]
      row[k] = (statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)
    summary[name] = row
    print(json.dumps({"summary": name, "seeds": len(runs),
                      **{k: [round(m, 4), round(s, 4)] for k, (m, s) in row.items()}}),
          flush=True)
  print(json.dumps({"cpu_wall_s": round(time.perf_counter() - tic, 1)}), flush=True)
  (root / "results.json").write_text(json.dumps({"seeds": _SEEDS.value, "summary": summary,
                                                 "runs": results}))
  _plot(summary, _SEEDS.value)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
