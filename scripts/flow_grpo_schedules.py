r"""LeanGRPO (arXiv 2609.03528) on Flow-GRPO (2505.05470), the synthetic analogue: both claims.

  python scripts/flow_grpo_schedules.py --root=/tmp/flow_grpo_repro          # both parts
  python scripts/flow_grpo_schedules.py --part=bench                         # schedules only
  python scripts/flow_grpo_schedules.py --part=train --seeds=3               # training only

(1) `bench` (KL coefficient `--beta`, default 0.01): LeanGRPO's claim, "the same gradient as
recomputation at lower cost". For |S| ∈ {2, 5, 10} of T = 10 SDE steps and four regimes (the
velocity MLP of configs/flow_grpo.py, width 64, all parameters trained; width 256, all trained;
width 256, output layer only; width 512, output layer only, 8 groups × 32 samples; the others
4 groups × 8 samples): per schedule (native / retain / reweight) the step time (median of
`--repeats` after 2 warm-up calls; rollout + reward + advantages + gradient, jitted), the
policy forward rows per step, XLA's temporary buffer bytes (`compiled.memory_analysis()`), and
the gradient's cosine and relative L2 distance to native's for the same noise. One JSON line
per measurement.

(2) `train`: Flow-GRPO raises the reward on the 2-D target. Per seed: flow-matching
pretraining (configs/flow_grpo.py:method=pretrain), then GRPO from it with each schedule of
`--schedules`; eval reward / target-mode share / coverage / KL to the pretrained policy before
(step 0) and after; the reward curve (mean ± std over seeds) goes to `--plot`.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from absl import flags
from flax import nnx

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402
from jaxrl_post.config_args import load_module  # noqa: E402
from jaxrl_post.models.velocity import VelocityMLP  # noqa: E402
from jaxrl_post.sampling import flow_sde  # noqa: E402
from jaxrl_post.tasks.flow_targets import target_reward  # noqa: E402
from jaxrl_post.training import lean_grpo as lg  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FLAGS = flags.FlagValues()
_ROOT = flags.DEFINE_string("root", "/tmp/flow_grpo_repro", "Workdirs of the runs.",
                            flag_values=FLAGS)
_PART = flags.DEFINE_enum("part", "all", ["all", "bench", "train"], "What to run.",
                          flag_values=FLAGS)
_SEEDS = flags.DEFINE_integer("seeds", 3, "Training seeds.", flag_values=FLAGS)
_SCHEDULES = flags.DEFINE_string("schedules", "reweight,retain,native", "GRPO runs per seed.",
                                 flag_values=FLAGS)
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed calls per measurement.", flag_values=FLAGS)
_BETA = flags.DEFINE_float("beta", 0.01, "KL coefficient in the bench (0: no reference).",
                           flag_values=FLAGS)
_PLOT = flags.DEFINE_string("plot", str(ROOT / "docs" / "flow_grpo_reward.png"), "Plot path.",
                            flag_values=FLAGS)
_OUT = flags.DEFINE_string("out", "", "Write the markdown tables here (prefix; '' = stdout).",
                           flag_values=FLAGS)

SCHEDULES = ("native", "retain", "reweight")


def emit(record: dict) -> None:
  print(json.dumps(record), flush=True)


def _flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def bench() -> list[dict]:
  rows = []
  num_steps = 10
  grid = flow_sde.time_grid(num_steps)
  settings = lg.FlowGRPOSettings(beta=_BETA.value)
  target = jnp.array([2.0, 0.0])

  def reward(x, c):
    return target_reward(x, target)

  # "full": every parameter trained; "head": the output layer only (a small trained set, the
  # regime LeanGRPO recommends Reweight for: LoRA), the rest frozen.
  # The last regime is the paper's in miniature: a forward that costs (width 512, 256 samples)
  # and a small trained set.
  for hidden, trained, groups, members in ((64, "full", 4, 8), (256, "full", 4, 8),
                                           (256, "head", 4, 8), (512, "head", 8, 32)):
    model = VelocityMLP(2, hidden=hidden, depth=3, rngs=nnx.Rngs(0))
    if trained == "full":
      graphdef, params = nnx.split(model, nnx.Param)
      frozen = None
    else:
      head = nnx.Any(nnx.PathContains("out_kernel"), nnx.PathContains("out_bias"))
      graphdef, params, frozen = nnx.split(model, head, nnx.Param)
    ref = jax.tree.map(lambda leaf: leaf + 0.01, params)

    def apply(p, x, t, c, graphdef=graphdef, frozen=frozen):
      model = nnx.merge(graphdef, p) if frozen is None else nnx.merge(graphdef, p, frozen)
      return model(x, t, c)

    rollout = lg.Rollout(jax.random.normal(jax.random.key(0), (groups, members, 2)),
                         jax.random.normal(jax.random.key(1), (num_steps, groups, members, 2)),
                         None)
    for num_sel in (2, 5, 10):
      selected = tuple(range(num_sel))
      grads = {}
      for schedule in SCHEDULES:
        def fn(p, r, schedule=schedule, selected=selected, apply=apply, ref=ref):
          ref_fn = (lambda x, t, c: apply(ref, x, t, c)) if settings.beta else None
          return lg.flow_grpo_gradient(schedule, apply, p, ref_fn, r, reward, grid=grid,
                                       selected=selected, settings=settings)

        tic = time.perf_counter()
        compiled = jax.jit(fn).lower(params, rollout).compile()
        compile_s = time.perf_counter() - tic
        memory = compiled.memory_analysis()
        for _ in range(2):
          out = jax.block_until_ready(compiled(params, rollout))
        times = []
        for _ in range(_REPEATS.value):
          tic = time.perf_counter()
          out = jax.block_until_ready(compiled(params, rollout))
          times.append(time.perf_counter() - tic)
        grads[schedule] = _flat(out.grads)
        a, b = grads["native"], grads[schedule]
        row = dict(what="flow_grpo_schedule", hidden=hidden, trained=trained,
                   params=int(sum(leaf.size for leaf in jax.tree.leaves(params))),
                   T=num_steps, S=num_sel,
                   samples=groups * members, schedule=schedule,
                   step_ms=1e3 * statistics.median(times), compile_s=compile_s,
                   forwards=int(out.forwards),
                   temp_bytes=int(getattr(memory, "temp_size_in_bytes", -1)),
                   cosine=float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))),
                   rel_l2=float(np.linalg.norm(a - b) / np.linalg.norm(a)))
        rows.append(row)
        emit(row)
  def cell(r):
    return r["hidden"], r["trained"], r["samples"], r["S"]

  native = {cell(r): r["step_ms"] for r in rows if r["schedule"] == "native"}
  for r in rows:
    r["speedup"] = native[cell(r)] / r["step_ms"]
  return rows


def bench_table(rows: list[dict]) -> str:
  lines = ["| width | trained (params) | samples | S/T | schedule | step (ms) | "
           "speed-up vs native | forwards / step | XLA temp (KiB) | grad cosine | grad rel-L2 |",
           "|" + "---|" * 11]
  for r in rows:
    lines.append(f"| {r['hidden']} | {r['trained']} ({r['params']}) | {r['samples']} | "
                 f"{r['S']}/{r['T']} | "
                 f"{r['schedule']} | {r['step_ms']:.2f} | "
                 f"{r['speedup']:.2f}× | {r['forwards']} | {r['temp_bytes'] / 1024:.0f} | "
                 f"{r['cosine']:.8f} | {r['rel_l2']:.1e} |")
  return "\n".join(lines)


def _train_run(workdir: Path, arg: str, **overrides):
  from jaxrl_post.methods.flow_grpo import FlowGRPO
  from jaxrl_post.training import loop

  module = load_module(ROOT / "configs" / "flow_grpo.py")
  config = module.get_config(arg)
  config.update(overrides)
  if not (workdir / "metrics.jsonl").exists() or not any(
      r.get("step") == config.steps and "eval/reward" in r for r in read_metrics(workdir)):
    tic = time.perf_counter()
    loop.train(config, workdir, FlowGRPO(config))
    emit(dict(what="flow_grpo_run", workdir=str(workdir), seconds=time.perf_counter() - tic))
  return read_metrics(workdir)


def train() -> tuple[dict, str]:
  root = Path(_ROOT.value)
  schedules = _SCHEDULES.value.split(",")
  curves: dict = {s: [] for s in schedules}
  table = {s: [] for s in schedules}
  for seed in range(_SEEDS.value):
    pre = root / f"seed_{seed}" / "pretrain"
    _train_run(pre, f"method=pretrain,seed={seed}")
    for schedule in schedules:
      records = _train_run(root / f"seed_{seed}" / schedule,
                           f"method=grpo,schedule={schedule},seed={seed}", init_from=str(pre))
      evals = [r for r in records if "eval/reward" in r]
      curves[schedule].append(([r["step"] for r in evals], [r["eval/reward"] for r in evals],
                               [r["eval/target_mode_share"] for r in evals]))
      first, last = evals[0], evals[-1]
      row = {k: (first[f"eval/{k}"], last[f"eval/{k}"])
             for k in ("reward", "target_mode_share", "mode_coverage", "kl_pretrained")}
      # Logged steps after the first (compilation): the loop's whole step, in ms.
      step_ms = 1e3 * np.median([r["time/step"] for r in records
                                 if "time/step" in r and r["step"] > 1])
      row["step_ms"] = (float("nan"), float(step_ms))
      table[schedule].append(row)
      emit(dict(what="flow_grpo_seed", seed=seed, schedule=schedule, **{
        f"{k}_{when}": v[i] for k, v in row.items() for i, when in enumerate(("before",
                                                                              "after"))}))
  _plot(curves)
  lines = ["| schedule | metric | before (pretrained) | after 200 GRPO steps |",
           "|---|---|---|---|"]
  for schedule, rows in table.items():
    for key in ("reward", "target_mode_share", "mode_coverage", "kl_pretrained", "step_ms"):
      before = np.array([r[key][0] for r in rows])
      after = np.array([r[key][1] for r in rows])
      first = ("—" if np.isnan(before).all() else f"{before.mean():.3f} ± {before.std():.3f}")
      lines.append(f"| {schedule} | {key} | {first} | {after.mean():.3f} ± {after.std():.3f} |")
  return table, "\n".join(lines)


def _plot(curves: dict) -> None:
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  for schedule, runs in curves.items():
    steps = np.array(runs[0][0])
    for ax, idx, label in ((axes[0], 1, "eval reward (ODE, 40 steps)"),
                           (axes[1], 2, "share of samples in the target mode")):
      values = np.array([r[idx] for r in runs])
      mean, std = values.mean(0), values.std(0)
      ax.plot(steps, mean, label=f"{schedule} ({len(runs)} seeds)")
      ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
      ax.set_xlabel("GRPO step")
      ax.set_ylabel(label)
  axes[0].set_title("Flow-GRPO on the 2-D two-mode target, r = −‖x − (2, 0)‖²", fontsize=9)
  axes[0].legend()
  fig.tight_layout()
  Path(_PLOT.value).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(_PLOT.value, dpi=120)
  emit(dict(what="flow_grpo_plot", path=_PLOT.value))


def main(argv) -> None:
  del argv
  out = {}
  if _PART.value in ("all", "bench"):
    out["benchmarks"] = bench_table(bench())
  if _PART.value in ("all", "train"):
    out["results"] = train()[1]
  for name, text in out.items():
    if _OUT.value:
      Path(f"{_OUT.value}_{name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
