r"""One GRPO step, timed by phase, with update throughput against a matmul peak from the same run.

  python scripts/bench_train_step.py                                 # `small`, arith, CPU
  python scripts/bench_train_step.py --config=configs/grpo_arith.py:model=qwen3_0p6b \
      --config.model_overrides.num_layers=2 --steps=2

  python scripts/bench_train_step.py --config.prompts_per_step=8 --config.group_size=4 \
      --config.max_new_tokens=64 --config.ppo_mini_batches=1 --config.num_micro_batches=1
      # the issue-22 case, with TRL's GRPOTrainer beside it (`--skip_trl`: ours only)
  python scripts/bench_train_step.py ... --config.rollout.old_logp=detached
      # the same, without the old-policy scoring pass (as TRL with one update per generation)
  python scripts/bench_train_step.py ... --cpu_devices=-1
      # the same with one single-threaded CPU device per core, rows split over them

The step is the one `experiments/grpo.py` runs (random-init policy, so
completions mostly run to `max_new_tokens`: the slow case): generate → reward
→ advantages → score (old policy) → reference (only with a KL term, β > 0) →
update. Prints JSON lines:
  {"what": "matmul_peak", ...}
  {"what": "grpo_step", "engine": "jaxrl_post", "time/generate": ..., "time/score": ...,
   "time/reference": ..., "time/update": ..., "update_tokens_per_s": ..., "update_mfu": ...}
  {"what": "grpo_step", "engine": "trl", "time/generate": ..., "time/update": ..., ...}
  {"what": "grpo_step_ratio", "step_speedup": TRL step / ours, "update_speedup": ..., ...}
Times are medians over `--steps` steps after one warm-up (compile) step.
Update FLOPs: 3 × forward FLOPs (forward + backward) of every padded token the
update processes, `ModelConfig.flops_per_token(seq_len)` per token.

Devices: by default XLA's own CPU layout, one device whose thread pool spans the
cores. `--cpu_devices=N` (-1: one per core) splits the host into N single-threaded
devices (`parallel.host.configure_cpu_devices`, as `config.mesh.cpu_devices` does in
the binaries; `bench_sampler.py`'s default layout) and runs the step as the binaries
run it on a mesh of those devices (`config.mesh` with `ici_data = N`: the policy born
sharded, the sampler and the train step on that mesh, each device with its own
rows); the matmul reference then runs on every device at once.

The reference engine (unless `--skip_trl`; needs `pip install trl`, which
brings `transformers`, `torch`, `datasets`): TRL's `GRPOTrainer` on the same
architecture and sizes (our preset as a `transformers` config, random init,
float32, CPU when JAX is on CPU), the same prompt texts through the same
character vocabulary, the same group size, completion length, temperature,
β, optimizer steps per generation (`ppo_mini_batches` × `ppo_epochs`, as
`steps_per_generation` / `num_iterations`) and micro-batches
(`gradient_accumulation_steps`); generation with `transformers.generate`
(TRL's default without vLLM). Its phases: generate (`_generate`), reward
(`_calculate_rewards`), score (the rest of `_prepare_inputs`: advantages and,
off-policy, the old log-probs; TRL skips those when one optimizer step uses
the generation, and its loss takes the detached current log-probs), update
(the optimizer steps' forward, backward and AdamW). The engines alternate
step by step (ours runs in a TRL callback between its steps), so a drift of
the host's speed falls on both; torch's OpenMP threads sleep when idle
(`OMP_WAIT_POLICY=PASSIVE` unless set), so they do not spin through our phases.
"""

import contextlib
import json
import os
import sys
import time

# PyTorch's OpenMP threads spin-wait after each parallel region by default;
# between two engines in one process (and on a shared host) that spinning
# steals the cores from the other engine's next phase (TRL's generate took 21 s
# instead of 0.45 s here under a load of 3). Read once, when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# GNU OpenMP still spins for GOMP_SPINCOUNT iterations before it sleeps: with
# the default, our update took 0.61 s right after a TRL step against 0.31 s with
# TRL skipped; with 0, 0.42 s (2026-12-04). Some interference remains: compare
# with `--skip_trl` (docs/benchmarks.md).
os.environ.setdefault("GOMP_SPINCOUNT", "0")

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from jaxrl_post import advantages as advantages_lib
from jaxrl_post.benchmarking import matmul_peak
from jaxrl_post.parallel import host
from jaxrl_post.parallel.axes import DEFAULT_RULES
from jaxrl_post.parallel.mesh import make_placement, put_batch
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import Sampler
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.async_rollouts import rollout_options
from jaxrl_post.training.checkpoint import StartPoint
from jaxrl_post.training.objectives import make_policy_loss
from jaxrl_post.training.ppo import ppo_mini_batches
from jaxrl_post.training.train_state import create_train_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", "configs/grpo_arith.py", "GRPO config.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed RL steps (after one warm-up step).")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 1024, "Matrix size of the peak reference.")
_SKIP_TRL = flags.DEFINE_bool("skip_trl", False, "Only time jaxrl_post (no TRL GRPOTrainer).")
_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", 0, "CPU only: split the host into this many single-threaded devices and run the "
  "step on a data mesh over them (-1: one per core; 0: XLA's default, one device with a thread "
  "pool).")

_PHASES = ("time/generate", "time/reward", "time/score", "time/reference", "time/update")


def _timed(timings, name, fn, *args, **kwargs):
  tic = time.perf_counter()
  out = jax.block_until_ready(fn(*args, **kwargs))
  timings[name] = time.perf_counter() - tic
  return out


def _hf_tokenizer(tokenizer):
  """Our tokenizer as a `transformers` fast tokenizer with the same ids (character vocabularies)."""
  import tokenizers as hf_tokenizers
  import transformers

  from jaxrl_post.tokenizers import CharTokenizer

  if not isinstance(tokenizer, CharTokenizer):
    raise ValueError("the TRL reference builds its tokenizer from a CharTokenizer; pass --skip_trl "
                     f"for {type(tokenizer).__name__}")
  vocab = {token: i for i, token in enumerate(tokenizer.special_tokens)}
  vocab.update({c: tokenizer.token_to_id(c) for c in tokenizer.alphabet})
  pad, bos, eos = tokenizer.special_tokens[:3]
  hf = hf_tokenizers.Tokenizer(hf_tokenizers.models.WordLevel(vocab=vocab, unk_token=pad))
  hf.pre_tokenizer = hf_tokenizers.pre_tokenizers.Split(hf_tokenizers.Regex("."), "isolated")
  hf.decoder = hf_tokenizers.decoders.Fuse()
  hf.add_special_tokens(list(tokenizer.special_tokens))
  out = transformers.PreTrainedTokenizerFast(tokenizer_object=hf, pad_token=pad, bos_token=bos,
                                             eos_token=eos)
  out.padding_side = "left"
  return out


def _run_trl(config, tokenizer, task, model_config, between_steps, num_steps: int):
  """Runs TRL's `GRPOTrainer` for `num_steps` generation cycles; per cycle, its phase times.

  `between_steps(i)` runs after TRL's cycle i (our step i), so the engines alternate.
  """
  import datasets
  import torch
  import transformers
  import trl

  from jaxrl_post.models.hf import config_to_hf

  torch.manual_seed(config.seed)
  hf_tokenizer = _hf_tokenizer(tokenizer)
  hf_config = config_to_hf(model_config)
  hf_config.update(bos_token_id=hf_tokenizer.bos_token_id, eos_token_id=hf_tokenizer.eos_token_id,
                   pad_token_id=hf_tokenizer.pad_token_id)
  hf_class = getattr(transformers, f"{hf_config['architectures'][0][:-len('ForCausalLM')]}Config")
  model = transformers.AutoModelForCausalLM.from_config(hf_class(**hf_config))
  p, g = config.prompts_per_step, config.group_size
  prompts = [task.make_example("train", i)["prompt"] for i in range(num_steps * p)]
  micro, mini = config.num_micro_batches, config.ppo_mini_batches
  rows = p * g
  if rows % (mini * micro):
    raise ValueError(f"{rows} rollouts do not split into {mini} mini-batches × {micro} "
                     "micro-batches")
  args = trl.GRPOConfig(
    output_dir="/tmp/bench_train_step_trl", report_to="none", save_strategy="no",
    logging_steps=10**6, disable_tqdm=True, use_cpu=jax.default_backend() == "cpu",
    seed=config.seed,
    per_device_train_batch_size=rows // (mini * micro), gradient_accumulation_steps=micro,
    steps_per_generation=mini * micro, num_iterations=config.ppo_epochs, num_generations=g,
    max_completion_length=config.max_new_tokens, temperature=config.temperature,
    top_k=config.top_k, top_p=config.top_p, beta=config.loss.beta,
    learning_rate=config.optimizer.lr, max_grad_norm=config.optimizer.grad_clip,
    max_steps=num_steps * mini * config.ppo_epochs, shuffle_dataset=False,
    # TRL turns activation checkpointing on by default; the reference follows ours.
    gradient_checkpointing=getattr(model_config, "remat_policy", "none") != "none")

  def reward(completions, **kwargs):
    del kwargs
    return [0.0 for _ in completions]

  trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                            train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                            processing_class=hf_tokenizer)
  cycle = {}
  cycles = []

  def timed(name, key):
    fn = getattr(trainer, name)

    def wrapper(*a, **kw):
      tic = time.perf_counter()
      out = fn(*a, **kw)
      cycle[key] = cycle.get(key, 0.0) + time.perf_counter() - tic
      return out

    setattr(trainer, name, wrapper)

  timed("_generate", "generate")
  timed("_calculate_rewards", "reward")
  timed("_prepare_inputs", "prepare")
  steps_per_cycle = mini * config.ppo_epochs

  class Clock(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
      self.tic = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
      cycle["step"] = cycle.get("step", 0.0) + time.perf_counter() - self.tic
      if state.global_step % steps_per_cycle == 0:
        cycles.append({
          "time/generate": cycle["generate"], "time/reward": cycle["reward"],
          "time/score": cycle["prepare"] - cycle["generate"] - cycle["reward"],
          "time/reference": 0.0, "time/update": cycle["step"] - cycle["prepare"],
          "padded_tokens": 0, "completion_tokens": 0, "seq_len": 0})
        cycle.clear()
        between_steps(len(cycles) - 1)

  trainer.add_callback(Clock())
  with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs as Python dicts
    trainer.train()
  return cycles, dict(torch_threads=torch.get_num_threads(), trl_version=trl.__version__)


def _median(rows):
  return {k: float(np.median([r[k] for r in rows])) for k in rows[0]}


def main(argv):
  del argv
  config = _CONFIG.value
  mesh, rules, sample_rules = None, DEFAULT_RULES, DEFAULT_RULES
  if _CPU_DEVICES.value:
    devices = host.configure_cpu_devices(_CPU_DEVICES.value, key="--cpu_devices")
    # The mesh the binaries would build for `config.mesh.ici_data = devices` (the trainer's;
    # the sampler shares it, as in a colocated run).
    with config.unlocked():
      for axis in config.mesh.mesh_axes:
        config.mesh[f"ici_{axis}"] = devices if axis == "data" else 1
      config.mesh.sampler_devices = 0
    placement = make_placement(config.mesh)
    mesh, rules, sample_rules = (placement.train_mesh, placement.train_rules,
                                 placement.sample_rules)
  reference = matmul_peak(_MATMUL_N.value, mesh=mesh)
  print(json.dumps(reference), flush=True)

  task = run_setup.build_task(config)
  tokenizer = run_setup.build_tokenizer(config)
  model = run_setup.build_model(config, tokenizer, StartPoint("scratch"), mesh, rules)
  loss_kwargs = {k: v for k, v in config.loss.items() if k != "name"}
  loss_fn = make_policy_loss(policy_loss=config.loss.name, temperature=config.temperature,
                                **loss_kwargs)
  optimizer = run_setup.build_optimizer(config, 1000)
  state = create_train_state(model, optimizer, jax.random.key(config.seed), mesh=mesh, rules=rules)
  # As in experiments/grpo.py: no reference model without a KL term.
  reference_params = jax.tree.map(jnp.copy, state.params) if config.loss.beta > 0 else None
  step_fn = make_train_step(nnx.split(model)[0], loss_fn, optimizer,
                            num_micro_batches=config.num_micro_batches,
                            mesh=mesh, rules=rules, shared=("num_tokens", "num_sequences"))
  sampler = Sampler(model, tokenizer, max_prompt_len=config.prompt_len, mesh=mesh,
                    rules=sample_rules)
  advantage_fn = advantages_lib.ADVANTAGES.get(config.advantage)
  g = config.group_size
  # `config.rollout.old_logp` (checked as the binaries check it): "trainer" scores the old
  # policy; "sampler" and "detached" (one update per step) skip that pass.
  old_logp_source = rollout_options(config).old_logp
  rows = []

  def one_step(step):
    nonlocal state
    records = [task.make_example("train", step * config.prompts_per_step + i)
               for i in range(config.prompts_per_step)]
    timings = {}
    rollout = _timed(timings, "time/generate", sampler.generate, state.params,
                     [r["prompt"] for r in records], n_samples_per_prompt=g,
                     max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                     rng=jax.random.key(step))
    tic = time.perf_counter()
    correct, fmt, _ = rewards_for(task, records, sampler.decode_text(rollout), g)
    adv = advantage_fn(jnp.asarray(np.stack([correct, fmt], 1)), rollout.group_ids,
                       num_groups=len(records), eps=config.advantage_eps)
    batch = dict(prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
                 completion_tokens=rollout.completion_tokens,
                 completion_mask=rollout.completion_mask, adv=adv)
    if mesh is not None:  # as the GRPO method puts its batch on the trainer's mesh
      batch = jax.block_until_ready(put_batch(batch, mesh, rules))
    timings["time/reward"] = time.perf_counter() - tic
    inputs = {k: v for k, v in batch.items() if k != "adv"}
    timings["time/score"] = 0.0
    if old_logp_source == "trainer":
      batch["old_logp"] = _timed(timings, "time/score", sampler.score, state.params, **inputs,
                                 temperature=config.temperature).logp
    elif old_logp_source == "sampler":
      batch["old_logp"] = rollout.logp
    # "detached": no old_logp; the loss takes its own log-probs under stop_gradient.
    timings["time/reference"] = 0.0
    if reference_params is not None:
      batch["ref_logp"] = _timed(timings, "time/reference", sampler.score, reference_params,
                                 **inputs, temperature=config.temperature).logp
    tic = time.perf_counter()
    shuffle = np.random.default_rng(step)
    for _ in range(config.ppo_epochs):
      for mini_batch in ppo_mini_batches(batch, config.ppo_mini_batches, shuffle):
        state, metrics = step_fn(state, mini_batch)
    jax.block_until_ready(metrics)
    timings["time/update"] = time.perf_counter() - tic
    seq_len = rollout.prompt_tokens.shape[1] + rollout.completion_tokens.shape[1]
    timings["padded_tokens"] = rollout.prompt_tokens.shape[0] * seq_len * config.ppo_epochs
    timings["completion_tokens"] = int(np.asarray(rollout.completion_mask).sum())
    timings["seq_len"] = seq_len
    if step:  # step 0 compiles
      rows.append(timings)

  trl_rows = trl_info = None
  if _SKIP_TRL.value:
    for step in range(_STEPS.value + 1):
      one_step(step)
  else:
    trl_rows, trl_info = _run_trl(config, tokenizer, task, model.config, one_step,
                                  _STEPS.value + 1)
    trl_rows = trl_rows[1:]  # its first step warms up too

  median = _median(rows)
  update_flops = 3 * median["padded_tokens"] * model.config.flops_per_token(median["seq_len"])
  total = sum(median[k] for k in _PHASES)
  common = {"model": config.model, "params_m": round(model.config.num_params() / 1e6, 2),
            "rollouts": config.prompts_per_step * g, "max_new_tokens": config.max_new_tokens,
            "ppo_epochs": config.ppo_epochs, "ppo_mini_batches": config.ppo_mini_batches,
            "num_micro_batches": config.num_micro_batches, "old_logp": old_logp_source,
            "devices": jax.device_count()}
  print(json.dumps({
    "what": "grpo_step", "engine": "jaxrl_post", **common, **{k: median[k] for k in _PHASES},
    "time/step": total, **{f"share/{k[5:]}": median[k] / total for k in _PHASES},
    "completion_tokens": median["completion_tokens"],
    "step_completion_tokens_per_s": median["completion_tokens"] / total,
    "update_tokens_per_s": median["padded_tokens"] / median["time/update"],
    "update_tflops": update_flops / median["time/update"] / 1e12,
    "update_mfu": update_flops / median["time/update"] / reference["flops_per_s"],
    "backend": jax.default_backend()}), flush=True)
  if trl_rows is None:
    return
  theirs = _median(trl_rows)
  trl_total = sum(theirs[k] for k in _PHASES)
  print(json.dumps({
    "what": "grpo_step", "engine": "trl", **common, **{k: theirs[k] for k in _PHASES},
    "time/step": trl_total, **{f"share/{k[5:]}": theirs[k] / trl_total for k in _PHASES},
    **trl_info}), flush=True)
  print(json.dumps({
    "what": "grpo_step_ratio", "step_speedup": trl_total / total,
    **{f"{k[5:]}_speedup": theirs[k] / median[k]
       for k in ("time/generate", "time/update") if median[k] > 0}}), flush=True)


if __name__ == "__main__":
  app.run(main)
