r"""MoE proxy reproduction (arXiv 2608.10823): (a) accuracy retention, (b) fault agreement.

(a) Claim (§3.4, secondary): clustering-selected proxies (three views + K-Medoids) retain more of
the original model's accuracy than frequency-only, and much more than random or first-K
selection. Synthetic analogue (PROPOSAL): `qwen3_moe_tiny` (16 experts, top-2,
2 layers) trained supervised on (a + b) mod 23, proxies with K ∈ {4, 8}.

(b) Claim (§3.3): a proxy run in the same GRPO stack reproduces the fault response of the full
model (metric direction and temporal trend) for (i) a rollout log-prob precision fault (the
rollout/training log-prob gap and the mismatch KL rise) and (ii) actor-update omission (reward
stagnates). Analogue: the full model pretrained for `--pretrain_steps` (partial accuracy, so
GRPO has room to improve), proxies with K = 8 of 16 experts; each of full / proxies runs
`--grpo_steps` GRPO steps (single-token answers, reward = exact match, group z-score
advantages, clipped surrogate, two PPO mini-batches a step) with `config.fault` ∈ {none,
logp_precision, no_update} switched on at `--onset` through `methods.fault_injection` (the
loop's own injectors). Per metric curve: slope-sign agreement, Spearman correlation of the
proxy's and the full model's curves, and whether the fault signature (faulted − clean after
the onset) has the same sign on the proxy. Cost: step time and parameter ratio.

  python scripts/moe_proxy_faults.py --part retention --seeds 3 --steps 300
  python scripts/moe_proxy_faults.py --part faults --seeds 3 | tee /tmp/moe_faults.jsonl
  python scripts/moe_proxy_faults.py --part faults --from_jsonl /tmp/moe_faults.jsonl  # replot

Prints JSON lines; writes docs/moe_proxy_retention.png and docs/moe_proxy_faults.png.
"""

import argparse
import json
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from scipy import stats

from jaxrl_post.advantages.outcome import contiguous_group_ids, group_advantages
from jaxrl_post.losses.policy import policy_loss
from jaxrl_post.methods import fault_injection
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models import moe_proxy as mp
from jaxrl_post.training.train_state import create_train_state, make_train_step

MOD, EQ = 23, 24  # tokens 0..22 are numbers, 24 is "="


def _data(rng, n):
  a, b = rng.integers(0, MOD, n), rng.integers(0, MOD, n)
  return np.stack([a, b, np.full(n, EQ)], 1).astype(np.int32), ((a + b) % MOD).astype(np.int32)


def _accuracy(model, x, y):
  return float(jnp.mean(jnp.argmax(jax.jit(lambda m, t: m(t))(model, x)[:, -1], -1) == y))


def train(seed, steps):
  model = CausalLM(get_model_config("qwen3_moe_tiny", vocab_size=32), rngs=nnx.Rngs(seed))
  opt = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  rng = np.random.default_rng(seed)

  @nnx.jit
  def step(model, opt, x, y):
    def loss(m):
      return optax.softmax_cross_entropy_with_integer_labels(m(x)[:, -1], y).mean()
    value, grads = nnx.value_and_grad(loss)(model)
    opt.update(model, grads)
    return value

  for _ in range(steps):
    step(model, opt, *map(jnp.asarray, _data(rng, 256)))
  return model


def retention_study(args):
  """Part (a): JSON lines per (seed, K, selection) and the retention plot."""
  grid = np.stack(np.meshgrid(np.arange(MOD), np.arange(MOD)), -1).reshape(-1, 2)
  x_all = jnp.asarray(np.concatenate([grid, np.full((len(grid), 1), EQ)], 1), jnp.int32)
  y_all = jnp.asarray(grid.sum(1) % MOD, jnp.int32)
  results = {}
  for seed in range(args.seeds):
    tic = time.time()
    model = train(seed, args.steps)
    full = _accuracy(model, x_all, y_all)
    calib = jnp.asarray(_data(np.random.default_rng(1000 + seed), 128)[0])  # disjoint draw
    print(json.dumps(dict(seed=seed, k=16, selection="full", accuracy=full,
                          train_s=round(time.time() - tic, 1))), flush=True)
    for k in (4, 8):
      for selection in ("kmedoids", "frequency", "random", "first_k"):
        proxy, keep = mp.build_moe_proxy(model, calib, k, selection=selection, seed=seed)
        acc = _accuracy(proxy, x_all, y_all)
        results.setdefault((k, selection), []).append(acc / max(full, 1e-9))
        print(json.dumps(dict(seed=seed, k=k, selection=selection, accuracy=acc,
                              retention=acc / max(full, 1e-9),
                              kept=[list(map(int, x)) for x in keep])), flush=True)
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3.5))
  sels = ("kmedoids", "frequency", "random", "first_k")
  for i, k in enumerate((4, 8)):
    means = [np.mean(results[(k, s)]) for s in sels]
    stds = [np.std(results[(k, s)]) for s in sels]
    ax.bar(np.arange(4) + 0.4 * i, means, 0.4, yerr=stds, label=f"K={k} of 16")
  ax.set_xticks(np.arange(4) + 0.2, sels)
  ax.set_ylabel("accuracy retention (proxy / full)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(args.retention_plot, dpi=120)
  for (k, s), v in sorted(results.items()):
    print(json.dumps(dict(summary=True, k=k, selection=s, mean=float(np.mean(v)),
                          std=float(np.std(v)), n=len(v))))




# ==== part (b): fault agreement of full model and proxies under GRPO ====

# PROPOSAL fault settings: the paper names neither the scaling factor nor the format. The scale
# s = 1/0.7 (1/T) held in float8_e4m3fn is 1.375, so every rollout log-prob is scaled by 0.9625.
FAULT_KNOBS = {
  "none": dict(name="none"),
  "logp_precision": dict(name="logp_precision", dtype="float8_e4m3fn", target="scale",
                         scale=1 / 0.7),
  "no_update": dict(name="no_update"),
}
CURVES = ("reward", "logp_gap", "mismatch_kl", "entropy", "grad_norm", "clip_frac",
          "greedy_acc")


def _policy_loss(model, batch):
  """GRPO clipped surrogate (`losses.policy.policy_loss`) on the one answer token."""
  logp_all = jax.nn.log_softmax(model(batch["tokens"])[:, 2].astype(jnp.float32))
  logp = jnp.take_along_axis(logp_all, batch["tokens"][:, 3:], -1)  # [B, 1]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, -1, keepdims=True)
  loss, aux = policy_loss(logp, batch["old_logp"], batch["adv"], batch["completion_mask"],
                          epsilon_low=0.2, epsilon_high=0.28, entropy=entropy)
  return loss, aux.additive()


class _Runner:
  """Compiled pieces shared by every run of one model shape (full, or K-expert proxies)."""

  def __init__(self, model, lr):
    graphdef = nnx.graphdef(model)
    self.optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))
    self.step_fn = make_train_step(graphdef, _policy_loss, self.optimizer)
    # Log-probs of the token after position 2 ("="): the sampler's and the trainer's view.
    self.answer_logp = jax.jit(lambda params, x: jax.nn.log_softmax(
      nnx.merge(graphdef, params)(x)[:, 2].astype(jnp.float32)))


def grpo_run(model, runner, fault_name, seed, *, steps, onset, prompts, group, lr_key,
             x_all, y_all):
  """Short GRPO run of `model` on (a + b) mod 23 with `config.fault` = `fault_name` from `onset`.

  Prompts, sampling noise and mini-batch shuffles depend only on `seed` (common random numbers
  across models and faults), so a fault's run equals the clean run until `onset`.
  Returns a dict of per-step curves (`CURVES`) and the steady-state step time.
  """
  fault = fault_injection.build_fault(ml_collections.ConfigDict(
    dict(fault=dict(FAULT_KNOBS[fault_name], start_step=onset))))
  state = create_train_state(model, runner.optimizer, lr_key)
  method = types.SimpleNamespace(step_fn=runner.step_fn)
  if fault is not None:
    fault.start(method, state)
  rng = np.random.default_rng(2000 + seed)
  ids = contiguous_group_ids(prompts * group, group)
  curves = {k: [] for k in CURVES}
  times = []
  for step in range(steps):
    tic = time.perf_counter()
    x, y = _data(rng, prompts)
    order = rng.permutation(prompts * group)
    lp = runner.answer_logp(state.params, jnp.asarray(x))  # [P, V] sampler log-probs
    key = jax.random.fold_in(jax.random.key(seed), step)
    answers = jax.random.categorical(key, lp[:, None, :], shape=(prompts, group))
    sampler_logp = np.asarray(jnp.take_along_axis(lp, answers, -1)).reshape(-1, 1)
    answers = np.asarray(answers).reshape(-1)
    reward = (answers == np.repeat(y, group)).astype(np.float32)
    tokens = np.concatenate([np.repeat(x, group, 0), answers[:, None]], 1).astype(np.int32)
    batch = dict(tokens=tokens, old_logp=sampler_logp.astype(np.float32),
                 completion_mask=np.ones((len(tokens), 1), bool),
                 adv=np.asarray(group_advantages(jnp.asarray(reward), ids,
                                                 num_groups=prompts)))
    if fault is not None:
      fault.begin_step(method, state, step)
      batch, _ = fault.transform(method, state, batch, None)
    # The trainer's log-probs of the rollout, before this step's updates, against the
    # (possibly faulted) rollout log-probs: the gap and a k3 estimate of KL(rollout ‖ trainer).
    trainer = np.asarray(runner.answer_logp(state.params, jnp.asarray(tokens)))
    trainer = np.take_along_axis(trainer, answers[:, None], -1)
    rho = trainer - batch["old_logp"]
    probs = np.exp(np.asarray(lp, np.float64))
    grad_norm, clip = [], []
    for half in np.split(order, 2):  # two PPO mini-batches
      state, metrics = method.step_fn(state, {k: jnp.asarray(v[half]) for k, v in batch.items()})
      grad_norm.append(float(metrics["grad_norm"]))
      clip.append(float(metrics["clip_frac_low"] + metrics["clip_frac_high"]))
    acc = float(np.mean(np.argmax(np.asarray(runner.answer_logp(state.params, x_all)), -1)
                        == y_all))
    times.append(time.perf_counter() - tic)
    for name, value in (("reward", reward.mean()), ("logp_gap", np.abs(rho).mean()),
                        ("mismatch_kl", np.mean(np.exp(rho) - 1 - rho)),
                        ("entropy", -np.sum(probs * np.log(np.maximum(probs, 1e-30)), -1).mean()),
                        ("grad_norm", np.mean(grad_norm)), ("clip_frac", np.mean(clip)),
                        ("greedy_acc", acc)):
      curves[name].append(float(value))
  return curves, float(np.median(times[2:]))


def _time_updates(pairs, args, repeats=30):
  """Median seconds of one `make_train_step` update per model, the models interleaved."""
  rng = np.random.default_rng(0)
  x, _ = _data(rng, args.prompts * args.group // 2)
  answers = rng.integers(0, MOD, len(x))
  batch = dict(tokens=jnp.asarray(np.concatenate([x, answers[:, None]], 1), jnp.int32),
               old_logp=jnp.full((len(x), 1), -2.0), adv=jnp.asarray(rng.normal(size=len(x))),
               completion_mask=jnp.ones((len(x), 1), bool))
  states = {k: create_train_state(m, r.optimizer, jax.random.key(0)) for k, (r, m) in
            pairs.items()}
  times = {k: [] for k in pairs}
  for i in range(repeats + 2):
    for k, (runner, _) in pairs.items():
      tic = time.perf_counter()
      states[k], metrics = runner.step_fn(states[k], batch)
      jax.block_until_ready(metrics["loss"])
      if i >= 2:
        times[k].append(time.perf_counter() - tic)
  return {k: float(np.median(v)) for k, v in times.items()}


def _slope_sign(curve, tol=1e-4):
  """Sign of the least-squares slope; |slope · len| < tol counts as flat (0)."""
  slope = np.polyfit(np.arange(len(curve)), curve, 1)[0]
  return 0 if abs(slope * len(curve)) < tol else int(np.sign(slope))


def _spearman(a, b):
  if np.ptp(a) == 0 or np.ptp(b) == 0:
    return float("nan")
  return float(stats.spearmanr(a, b).statistic)


def replot(args):
  """Agreement rows and the plot again from a saved `--part faults` output (`--from_jsonl`);
  the saved curves are rounded to 5 decimals, so float-noise curves (~1e-8) read as 0."""
  runs = {}
  for line in open(args.from_jsonl):
    row = json.loads(line)
    if row.get("part") == "faults" and "summary" not in row:
      runs[(row["seed"], row["model"], row["fault"])] = {k: row[k] for k in CURVES}
  models = list(dict.fromkeys(m for _, m, _ in runs))
  args.seeds = 1 + max(s for s, _, _ in runs)
  args.grpo_steps = len(next(iter(runs.values()))["reward"])
  summary = _agreement(runs, tuple(models), args)
  _plot_faults(runs, tuple(models), args)
  return summary


def fault_study(args):
  """Part (b): JSON lines per run and per (fault, proxy, metric) agreement; the plot."""
  if args.from_jsonl:
    return replot(args)
  grid = np.stack(np.meshgrid(np.arange(MOD), np.arange(MOD)), -1).reshape(-1, 2)
  x_all = jnp.asarray(np.concatenate([grid, np.full((len(grid), 1), EQ)], 1), jnp.int32)
  y_all = np.asarray(grid.sum(1) % MOD)
  selections = ("full",) + tuple(args.selections.split(","))
  runs, costs = {}, {}
  runners = {}
  for seed in range(args.seeds):
    model = train(seed, args.pretrain_steps)
    calib = jnp.asarray(_data(np.random.default_rng(1000 + seed), 128)[0])
    models = {"full": model}
    for sel in selections[1:]:
      models[sel] = mp.build_moe_proxy(model, calib, args.k, selection=sel, seed=seed)[0]
    for sel, m in models.items():
      e = m.config.num_experts
      runner = runners.setdefault(e, _Runner(m, args.lr))
      params = sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
      for fault_name in FAULT_KNOBS:
        tic = time.time()
        curves, step_s = grpo_run(m, runner, fault_name, seed, steps=args.grpo_steps,
                                  onset=args.onset, prompts=args.prompts, group=args.group,
                                  lr_key=jax.random.key(seed), x_all=x_all, y_all=y_all)
        runs[(seed, sel, fault_name)] = curves
        costs.setdefault(sel, []).append((step_s, params))
        print(json.dumps(dict(part="faults", seed=seed, model=sel, experts=e, params=params,
                              fault=fault_name, step_s=round(step_s, 4),
                              run_s=round(time.time() - tic, 1),
                              **{k: [round(v, 5) for v in c] for k, c in curves.items()})),
              flush=True)
  summary = _agreement(runs, selections, args)
  # Update cost on one fixed batch, full and proxy calls interleaved (the shared CPU's load
  # then weighs on both alike): median seconds per train step.
  timed = _time_updates({sel: (runners[models[sel].config.num_experts], models[sel])
                         for sel in ("full", selections[1])}, args)
  full_s = np.median([c[0] for c in costs["full"]])
  for sel in selections:
    s = np.median([c[0] for c in costs[sel]])
    row = dict(part="faults", summary="cost", model=sel, step_s=round(float(s), 4),
               step_ratio=round(float(s / full_s), 3), params=costs[sel][0][1],
               param_ratio=round(costs[sel][0][1] / costs["full"][0][1], 3))
    if sel in timed:
      row.update(update_s=round(timed[sel], 5), update_ratio=round(timed[sel] / timed["full"], 3))
    print(json.dumps(row))
  _plot_faults(runs, selections, args)
  return summary


def _agreement(runs, selections, args):
  """Trend agreement of each proxy with the full model, per fault and metric, over seeds.

  * slope_agree: share of seeds where the post-onset least-squares slope has the same sign
    (flat within 1e-4 over the window counts as 0) for proxy and full model.
  * spearman: Spearman correlation of the proxy's and the full model's whole curves.
  * signature: the post-onset mean of (faulted − clean) per seed; `sig_agree` is the share of
    seeds where its sign matches the full model's, `sig_full` / `sig_proxy` mean ± std.
  """
  out = []
  window = slice(args.onset, None)
  for fault_name in FAULT_KNOBS:
    for sel in selections[1:]:
      for metric in CURVES:
        slope, rho, sig_f, sig_p = [], [], [], []
        for seed in range(args.seeds):
          full = np.asarray(runs[(seed, "full", fault_name)][metric])
          proxy = np.asarray(runs[(seed, sel, fault_name)][metric])
          slope.append(_slope_sign(full[window]) == _slope_sign(proxy[window]))
          rho.append(_spearman(full, proxy))
          if fault_name != "none":
            sig_f.append(float(np.mean(full[window] - np.asarray(
              runs[(seed, "full", "none")][metric])[window])))
            sig_p.append(float(np.mean(proxy[window] - np.asarray(
              runs[(seed, sel, "none")][metric])[window])))
        row = dict(part="faults", summary="agreement", fault=fault_name, model=sel,
                   metric=metric, slope_agree=float(np.mean(slope)),
                   spearman_mean=float(np.nanmean(rho)) if not np.all(np.isnan(rho)) else None,
                   spearman_std=float(np.nanstd(rho)) if not np.all(np.isnan(rho)) else None)
        if sig_f:
          row.update(sig_full=[float(np.mean(sig_f)), float(np.std(sig_f))],
                     sig_proxy=[float(np.mean(sig_p)), float(np.std(sig_p))],
                     sig_agree=float(np.mean(np.sign(sig_f) == np.sign(sig_p))))
        out.append(row)
        print(json.dumps(row), flush=True)
  return out


def _plot_faults(runs, selections, args):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  metrics = ("reward", "entropy", "logp_gap", "mismatch_kl", "grad_norm")
  faults = tuple(FAULT_KNOBS)
  fig, axes = plt.subplots(len(faults), len(metrics), figsize=(3.2 * len(metrics), 7.5),
                           squeeze=False)
  colors = dict(full="k", kmedoids="tab:blue", frequency="tab:orange", random="tab:red",
                first_k="tab:green")
  steps = np.arange(args.grpo_steps)
  for i, fault_name in enumerate(faults):
    for j, metric in enumerate(metrics):
      ax = axes[i, j]
      for sel in selections:
        ys = np.asarray([runs[(s, sel, fault_name)][metric] for s in range(args.seeds)])
        m, sd = ys.mean(0), ys.std(0)
        ax.plot(steps, m, color=colors.get(sel), label=sel, lw=1.2)
        ax.fill_between(steps, m - sd, m + sd, color=colors.get(sel), alpha=0.15)
      if fault_name != "none":
        ax.axvline(args.onset, color="grey", ls=":", lw=1)
      ax.set_title(f"{fault_name}: {metric}", fontsize=9)
      if metric in ("logp_gap", "mismatch_kl"):  # ~1e-8 without the precision fault: float noise
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_ylim(-1e-5, 0.2)
      if i == len(faults) - 1:
        ax.set_xlabel("GRPO step")
  axes[0, 0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(args.faults_plot, dpi=110)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--part", choices=("retention", "faults", "all"), default="all")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=300, help="(a) supervised steps")
  parser.add_argument("--retention_plot", default="docs/moe_proxy_retention.png")
  parser.add_argument("--pretrain_steps", type=int, default=80, help="(b) supervised steps")
  parser.add_argument("--k", type=int, default=8, help="(b) experts kept of 16")
  parser.add_argument("--selections", default="kmedoids,frequency,random")
  parser.add_argument("--grpo_steps", type=int, default=30)
  parser.add_argument("--onset", type=int, default=8)
  parser.add_argument("--prompts", type=int, default=32)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--faults_plot", default="docs/moe_proxy_faults.png")
  parser.add_argument("--from_jsonl", default="", help="(b) replot a saved output, no training")
  args = parser.parse_args()
  if args.part in ("retention", "all"):
    retention_study(args)
  if args.part in ("faults", "all"):
    fault_study(args)


if __name__ == "__main__":
  main()
