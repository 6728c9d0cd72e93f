r"""PCQA-R1 (arXiv 2608.18627) component chain and regression baseline on synthetic point clouds.

  python experiments/pcqa.py --config=configs/pcqa_synthetic.py --workdir=/tmp/pcqa
  python scripts/pcqa_table.py --workdir=/tmp/pcqa --out=docs/pcqa

For each seed: a base format stage (shared by the seed's methods), then every method of
`config.methods` (configs/pcqa_synthetic.py lists them), each evaluated greedily on the test
splits of all datasets (PLCC after the 4-parameter logistic, SRCC; averaged in-domain + OOD and
OOD only). With `config.capable_steps` = n > 0 a shared `capable` stage (n SFT steps on the
templated rationales) follows base and the LM methods start from it (the regression baseline
trains n more steps from base instead; configs/pcqa_synthetic.py). Layout:
`workdir/seed_<s>/{base,capable,<method>}/` with `metrics.jsonl`, TensorBoard events,
an orbax checkpoint of the final state and, last, `final.json`; a rerun skips finished runs.
One process reuses every compiled kernel across seeds and methods (shapes do not change).

Runtime on the shared 2-core CPU machine: ≈ 18 min per seed with the default config (each GRPO
run ≈ 4.5–5 min), ≈ 2 min for `:runlocal`. Results and what they show: docs/results.md
(PCQA-R1 section) — the regression baseline wins here; the GRPO variants' greedy answers
collapse to one score.
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from jaxrl_post.models import get_model_config
from jaxrl_post.models.point_cloud import PointCloudLM
from jaxrl_post.tasks import point_clouds as pc
from jaxrl_post.tokenizers import get_tokenizer
from jaxrl_post.training import pcqa, rl
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer
from jaxrl_post.training.metrics import MetricWriter
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])

_NORMALIZERS = ("num_tokens", "num_sequences")


def main(argv):
  del argv
  config, workdir = _CONFIG.value, Path(_WORKDIR.value)

  # ---- Data: the source's train split, every dataset's test split ----
  names = config.datasets.split(",")
  if config.source not in names:
    raise ValueError(f"config.source={config.source!r} is not in config.datasets={names}")
  for name in names:
    pc.DATASETS.get(name)  # unknown names fail here, listing the valid ones
  methods = config.methods.split(",")
  grid, num_points = config.encoder.grid, config.num_points
  tic = time.perf_counter()
  train = pc.load_split(config.source, "train", size=config.train_size or None,
                        num_points=num_points, grid=grid)
  test = {d: pc.load_split(d, "test", size=config.test_size or None, num_points=num_points,
                           grid=grid) for d in names}
  logging.info("data: %d train (%s), test %s in %.1fs", len(train.mos), config.source,
               {d: len(t.mos) for d, t in test.items()}, time.perf_counter() - tic)
  if config.batch_size > len(train.mos):
    raise ValueError(f"config.batch_size={config.batch_size} exceeds the {len(train.mos)} "
                     "training samples")

  # ---- Tokenizer, model graph, jitted kernels and update steps (compiled once) ----
  tokenizer = get_tokenizer(config.tokenizer)
  lm_config = get_model_config(config.model, vocab_size=tokenizer.vocab_size,
                               **dict(config.model_overrides))

  def new_model(seed):
    return PointCloudLM(lm_config, num_views=pc.NUM_VIEWS, grid=grid, patch=config.encoder.patch,
                        channels=len(pc.CHANNELS), width=config.encoder.width,
                        depth=config.encoder.depth, rngs=nnx.Rngs(seed))

  graphdef = nnx.split(new_model(0))[0]
  text_tokens = np.asarray(tokenizer.encode(pcqa.PROMPT), np.int32)
  g = config.grpo
  k = pcqa.build_kernels(graphdef, text_tokens, num_samples=g.num_samples,
                         max_new_tokens=config.completion_len, eos_id=tokenizer.eos_id,
                         pad_id=tokenizer.pad_id, temperature=g.temperature)
  text = jnp.asarray(text_tokens)
  # Every stage decays its learning rate over its own length (warm-up, cosine to lr / 10):
  # a constant rate left the SFT policy oscillating (ID SRCC 0.52 → −0.36 in 25 steps).
  # One jitted step per (loss, length), compiled once and shared by all seeds.
  losses_by_kind = {
    "sft": (pcqa.make_sft_loss(text), "sft_optimizer", _NORMALIZERS),
    "grpo": (pcqa.make_grpo_loss(text, epsilon=g.epsilon, beta=g.beta,
                                 kl_estimator=g.kl_estimator, temperature=g.temperature),
             "rl_optimizer", _NORMALIZERS),
    "regression": (pcqa.make_regression_loss(text), "regression_optimizer",
                   ("num_sequences",)),
  }
  compiled = {}

  def train_step(kind, num_steps):
    if (kind, num_steps) not in compiled:
      loss_fn, key, shared = losses_by_kind[kind]
      optimizer = run_setup.build_optimizer(
        ml_collections.ConfigDict({"optimizer": config[key]}), num_steps)
      compiled[kind, num_steps] = (optimizer, make_train_step(graphdef, loss_fn, optimizer,
                                                              shared=shared))
    return compiled[kind, num_steps]

  logging.info("model: %d parameters, %d visual tokens + %d prompt characters",
               sum(x.size for x in jax.tree.leaves(nnx.state(new_model(0), nnx.Param))),
               (grid // config.encoder.patch) ** 2 * pc.NUM_VIEWS, len(text_tokens))

  def fresh_state(kind, num_steps, seed, params):
    state = create_train_state(new_model(seed), train_step(kind, num_steps)[0],
                               jax.random.key(seed))
    # Copies: the step donates its state, and `params` is reused by the seed's other runs.
    return state.replace(params=jax.tree.map(jnp.copy, params))

  # With `capable_holdout` > 0 the capable stage and the methods after it draw from disjoint
  # parts of the source train split (`pcqa.holdout_pools`).
  capable_steps = int(config.get("capable_steps", 0))
  num_train = len(train.mos)
  try:
    pools = pcqa.holdout_pools(num_train, config.get("capable_holdout", 0.0) if capable_steps
                               else 0, config.batch_size)
  except ValueError as e:
    raise ValueError(f"config.capable_holdout: {e}") from None

  def batch_index(seed, stage, step):
    rng = np.random.default_rng([seed, stage, step])
    pool = pools.get(stage)
    if pool is None:
      return np.sort(rng.choice(num_train, config.batch_size, replace=False)), rng
    return np.sort(pool[rng.choice(len(pool), config.batch_size, replace=False)]), rng

  def check_finite(metrics, where):
    if int(metrics["nonfinite_streak"]) >= config.max_nonfinite_streak:
      raise RuntimeError(f"{where}: {int(metrics['nonfinite_streak'])} updates in a row had a "
                         "non-finite loss or gradient")

  def evaluate(writer, step, params, kind):
    tic = time.perf_counter()
    if kind == "regression":
      result = pcqa.evaluate_regressor(k, params, test, source=config.source,
                                       batch_size=config.eval_batch)
    else:
      result = pcqa.evaluate_lm(k, params, tokenizer, test, source=config.source,
                                batch_size=config.eval_batch)
    result["time/eval"] = time.perf_counter() - tic
    writer.write(step, {f"eval/{key}": v for key, v in result.items()})
    return result

  # ---- Stages: SFT (base / cold start / SFT-only), GRPO, regression ----
  def run_sft(state, writer, *, seed, stage, kind, num_steps, first=0, eval_kind=None):
    bar = tqdm.tqdm(range(num_steps), desc=f"seed{seed}:{kind}-sft", leave=False)
    for i in bar:
      index, rng = batch_index(seed, stage, i)
      batch = rl.with_normalizers(pcqa.sft_batch(tokenizer, train, index,
                                                 completion_len=config.completion_len,
                                                 kind=kind, rng=rng))
      state, metrics = train_step("sft", num_steps)[1](state, batch)
      check_finite(metrics, f"seed {seed} {kind} SFT step {i}")
      step = first + i + 1
      if step % config.log_every == 0 or i == num_steps - 1:
        writer.write(step, {f"sft/{key}": v for key, v in run_setup.host_metrics(metrics).items()})
      if eval_kind and config.eval_every and step % config.eval_every == 0 and i < num_steps - 1:
        evaluate(writer, step, state.params, eval_kind)
      bar.set_postfix(nll=f"{float(metrics['nll']):.3f}")
    return state

  def run_grpo(state, writer, *, seed, alpha, first):
    ref_params = jax.tree.map(jnp.copy, state.params)  # π_ref: the policy GRPO starts from
    key = jax.random.key(seed + 1)
    bar = tqdm.tqdm(range(config.rl_steps), desc=f"seed{seed}:grpo", leave=False)
    for i in bar:
      tic = time.perf_counter()
      index, _ = batch_index(seed, pcqa.STAGE_GRPO, i)
      views = train.views[index]
      out = k.sample(state.params, views, jax.random.fold_in(key, i))
      texts = pcqa.decode_completions(tokenizer, out.tokens, out.mask)
      rewards = pcqa.rollout_rewards(
        texts, train.mos01[index], num_samples=g.num_samples, step=i,
        total_steps=config.rl_steps, alpha=alpha, sigma=g.sigma, scale=g.scale, gamma=g.gamma,
        hold_fraction=g.hold_fraction, final_weight=g.final_weight,
        gaussian_units=g.gaussian_units, adv_eps=g.adv_eps)
      rows = np.repeat(views, g.num_samples, axis=0)
      ref_logp = k.score(ref_params, rows, out.tokens, out.mask)
      batch = rl.with_normalizers(dict(views=rows, completion_tokens=out.tokens,
                                       completion_mask=out.mask, old_logp=out.logp,
                                       ref_logp=ref_logp, adv=jnp.asarray(rewards.adv)))
      state, metrics = train_step("grpo", config.rl_steps)[1](state, batch)
      check_finite(metrics, f"seed {seed} GRPO step {i}")
      step = first + i + 1
      terms = rewards.terms
      valid = np.asarray(terms.valid)
      record = {f"grpo/{key}": v for key, v in run_setup.host_metrics(metrics).items()}
      record.update({
        "reward/total": float(np.mean(terms.total)), "reward/ranking": float(np.mean(
          terms.ranking)), "reward/proximity": float(np.mean(terms.proximity)),
        "reward/format": float(np.mean(terms.format)),
        "reward/format_weight": float(terms.format_weight),
        "reward/unparseable": rewards.num_unparseable / valid.size,
        "rollout/score_std_within": float(np.nanmean(np.nanstd(
          np.where(valid, rewards.scores, np.nan), axis=1))) if valid.any() else 0.0,
        "rollout/length": float(np.mean(np.asarray(out.mask).sum(1))),
        "time/step": time.perf_counter() - tic, "rollout/example": texts[0]})
      if step % config.log_every == 0 or i == config.rl_steps - 1:
        writer.write(step, record)
      if config.eval_every and step % config.eval_every == 0 and i < config.rl_steps - 1:
        evaluate(writer, step, state.params, "lm")
      bar.set_postfix(r=f"{record['reward/total']:.2f}", rk=f"{record['reward/ranking']:.2f}")
    return state

  def run_regression(state, writer, *, seed, num_steps):
    for i in tqdm.trange(num_steps, desc=f"seed{seed}:regression", leave=False):
      index, _ = batch_index(seed, pcqa.STAGE_REGRESSION, i)
      batch = dict(views=train.views[index], mos01=jnp.asarray(train.mos01[index], jnp.float32),
                   num_sequences=jnp.float32(len(index)))
      state, metrics = train_step("regression", num_steps)[1](state, batch)
      check_finite(metrics, f"seed {seed} regression step {i}")
      if (i + 1) % config.log_every == 0 or i == num_steps - 1:
        writer.write(i + 1, {f"regression/{key}": v
                             for key, v in run_setup.host_metrics(metrics).items()})
      if config.eval_every and (i + 1) % config.eval_every == 0 and i < num_steps - 1:
        evaluate(writer, i + 1, state.params, "regression")
    return state

  def finish(run_dir, writer, state, step, kind, seconds):
    result = evaluate(writer, step, state.params, kind)
    checkpointer = Checkpointer(run_setup.checkpoint_dir(run_dir), max_to_keep=1)
    checkpointer.save(step, state)
    checkpointer.close()
    writer.close()
    result["time/run"] = seconds
    (run_dir / "final.json").write_text(json.dumps(result, indent=1) + "\n")
    return result

  def shared_stage(seed_dir, name, *, seed, stage, kind, num_steps, params, eval_kind=None):
    """A stage shared by the seed's methods (base, capable): trained once, then restored."""
    run_dir = seed_dir / name
    state = fresh_state("sft", num_steps, seed, params)
    if (run_dir / "final.json").exists():
      logging.info("seed %d: %s stage restored from %s", seed, name, run_dir)
      return Checkpointer(run_setup.checkpoint_dir(run_dir)).restore_params(None, state.params)
    tic = time.perf_counter()
    writer = MetricWriter(run_dir)
    writer.write_config(config)
    state = run_sft(state, writer, seed=seed, stage=stage, kind=kind, num_steps=num_steps,
                    eval_kind=eval_kind)
    result = finish(run_dir, writer, state, num_steps, "lm", time.perf_counter() - tic)
    logging.info("seed %d %s (%.0fs): %s", seed, name, result["time/run"],
                 {key: round(v, 3) for key, v in result.items()
                  if key.startswith(("avg", "syn"))})
    if name == "capable":
      print(f"seed {seed} capable({num_steps}) ID PLCC/SRCC "
            f"{result[f'{config.source}/plcc']:.3f}/{result[f'{config.source}/srcc']:.3f}  "
            f"({result['time/run']:.0f}s)", flush=True)
    return state.params

  # ---- Runs: per seed, the base stage (and the capable stage), then each method ----
  budget = config.cold_start_steps + config.rl_steps
  for s in range(config.num_seeds):
    seed = config.seed + s
    seed_dir = workdir / f"seed_{seed}"
    base_params = shared_stage(seed_dir, "base", seed=seed, stage=pcqa.STAGE_BASE, kind="base",
                               num_steps=config.base_steps,
                               params=nnx.state(new_model(seed), nnx.Param))
    # The LM methods' start point and its step count (their steps continue from it).
    start_params, offset = base_params, 0
    if capable_steps:
      start_params = shared_stage(seed_dir, "capable", seed=seed, stage=pcqa.STAGE_CAPABLE,
                                  kind="cot", num_steps=capable_steps, params=base_params,
                                  eval_kind="lm")
      offset = capable_steps
    for method in methods:
      run_dir = seed_dir / method
      if (run_dir / "final.json").exists():
        logging.info("seed %d %s: done, skipped", seed, method)
        continue
      tic = time.perf_counter()
      writer = MetricWriter(run_dir)
      writer.write_config(config)
      if method == "regression":
        # From the base trunk for the capable stage's steps + the budget: the same number of
        # steps after base as capable + sft, without the rationale SFT (config docstring).
        steps = offset + budget
        state = run_regression(fresh_state("regression", steps, seed, base_params), writer,
                               seed=seed, num_steps=steps)
        result = finish(run_dir, writer, state, steps, "regression", time.perf_counter() - tic)
      elif method == "sft":
        state = run_sft(fresh_state("sft", budget, seed, start_params), writer, seed=seed,
                        stage=pcqa.STAGE_SFT, kind="cot", num_steps=budget, first=offset,
                        eval_kind="lm")
        result = finish(run_dir, writer, state, offset + budget, "lm",
                        time.perf_counter() - tic)
      else:
        params, first = start_params, offset
        if method == "full":
          cold = run_sft(fresh_state("sft", config.cold_start_steps, seed, start_params), writer,
                         seed=seed, stage=pcqa.STAGE_SFT, kind="cot",
                         num_steps=config.cold_start_steps, first=offset)
          params, first = cold.params, offset + config.cold_start_steps
        alpha = 0.0 if method == "rank" else 1.0
        state = run_grpo(fresh_state("grpo", config.rl_steps, seed, params), writer, seed=seed,
                         alpha=alpha, first=first)
        result = finish(run_dir, writer, state, first + config.rl_steps, "lm",
                        time.perf_counter() - tic)
      logging.info("seed %d %s (%.0fs): %s", seed, method, result["time/run"],
                   {key: round(v, 3) for key, v in result.items() if "avg/" in key})
      print(f"seed {seed} {method:10s} ID PLCC/SRCC {result[f'{config.source}/plcc']:.3f}/"
            f"{result[f'{config.source}/srcc']:.3f}  OOD-avg "
            f"{result.get('ood_avg/plcc', float('nan')):.3f}/"
            f"{result.get('ood_avg/srcc', float('nan')):.3f}  ({result['time/run']:.0f}s)",
            flush=True)

  # ---- Summary over seeds ----
  rows = (["capable"] if capable_steps else []) + methods
  table = pcqa.aggregate_runs(workdir, rows, names, source=config.source)
  (workdir / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
  print(pcqa.format_table(table, names, source=config.source))


if __name__ == "__main__":
  app.run(main)
