r"""Compiles the GRPO update and the sampler's prefill and decode for a preset and mesh from shapes.

  python scripts/aot_compile.py --model=qwen3_8b --ici=fsdp=8 --batch=16 --prompt_len=256 \
      --completion_len=768
  python scripts/aot_compile.py --model=qwen3_8b --ici=fsdp=4,tensor=2 --sample_ici=tensor=8 \
      --param_dtype=bfloat16 --dtype=bfloat16
  python scripts/aot_compile.py --model=qwen3_8b --topology=v5p:2x2x2 ...   # needs libtpu
  python scripts/aot_compile.py --model=qwen3_0p6b --ici=fsdp=1 --num_cpu_devices=1 \
      --param_dtype=bfloat16 --dtype=bfloat16 --batch=16 --prompt_len=256 --completion_len=768 \
      --moments_dtype=params --remat_policy=full --logit_chunk_size=128   # docs/benchmarks.md
  python scripts/aot_compile.py --config=configs/grpo_gsm8k.py:model=qwen3_8b,mesh=gpu8
  python scripts/aot_compile.py --config=configs/grpo_gsm8k.py:model=qwen3_8b,mesh=gpu8 \
      --config.lora.rank=64 --skip=prefill,decode_step     # LoRA: adapters trained, base frozen

With `--config`, an experiment config (a GRPO-family binary's) gives every size instead of the
flags: the preset (`config.model`), dtypes and run options, the mesh (`config.mesh` over
`--num_cpu_devices`, which defaults to the mesh's size), the update's rows (one PPO
mini-batch: prompts_per_step × group_size / ppo_mini_batches, in `num_micro_batches`), the
prompt and completion lengths, the optimizer's moment dtype, and the sampler's batch (the
step's rollouts) — what that binary would compile.

Nothing is materialised: parameters, optimizer state, batch and KV cache are
`jax.ShapeDtypeStruct`s carrying their `NamedSharding`s, the steps are
lowered and compiled for the mesh, and XLA's memory analysis says what one
device would hold. Use it to find an OOM or a bad mesh before reserving the
hardware. On CPU the mesh is made of `--num_cpu_devices` fake devices.

Prints one JSON line per program (bytes are per device):
  {"what": "train_step", "params_bytes": ..., "opt_state_bytes": ...,
   "temp_bytes": ..., "argument_bytes": ..., "output_bytes": ..., "compile_s": ...}
  {"what": "prefill", "params_bytes": ..., "temp_bytes": ..., "compile_s": ...}
  {"what": "decode_step", "params_bytes": ..., "kv_cache_bytes": ..., "temp_bytes": ...}
`params_bytes` / `opt_state_bytes` / `kv_cache_bytes` come from the shardings
(shard shape × dtype); `temp_bytes` (activations and other temporaries),
`argument_bytes`, `output_bytes` and `alias_bytes` from
`compiled.memory_analysis()` (null where the backend does not report them);
`peak_rss_bytes` is this process's peak host memory, which stays far below
the model's size because nothing is materialised. XLA:CPU schedules for
speed, not memory, so its `temp_bytes` are an upper bound of what a GPU or
TPU compile reports for the same program; compile on the target for the
real figure.
The train step is `make_train_step` (forward + backward + clipped AdamW, or the `--optimizer`
that `setup.build_optimizer` makes) with the GRPO loss, as `experiments/grpo.py` runs it
(float32 Adam moments unless `--moments_dtype=params`; the preset's scan / remat / logit-chunk /
attention settings unless a flag overrides them). With `--lora_rank` > 0 (or `config.lora.rank`)
it is the LoRA step: adapters (`--lora_targets`) are the trained state, the base is the frozen
input (`make_train_step(frozen=...)`); `params_bytes` / `opt_state_bytes` are then the adapters'
and `frozen_bytes` the base's. The sampler's programs run the base graph either way (a LoRA run
samples with merged kernels). The prefill is `kernels.prefill` of `--sample_batch` prompts, and
the decode step the sampler's `kernels.decode` loop over `--max_new_tokens` tokens.
"""

import functools
import json
import math
import resource
import time

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from jaxrl_post.benchmarking import compile_sizes
from jaxrl_post.models import CausalLM, LoraParam, add_lora, get_model_config, subspace
from jaxrl_post.models.lora import DEFAULT_TARGETS
from jaxrl_post.parallel import axes
from jaxrl_post.parallel import mesh as mesh_lib
from jaxrl_post.parallel.axes import axis_rules, logical_sharding, state_shardings
from jaxrl_post.sampling import kernels
from jaxrl_post.training import base_configs
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.objectives import make_policy_loss
from jaxrl_post.training.train_state import TrainState, make_train_step, train_state_shardings

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "An experiment config whose sizes replace the flags (see the docstring).")
_MODEL = flags.DEFINE_string("model", "qwen3_8b", "Model preset.")
_NUM_LAYERS = flags.DEFINE_integer("num_layers", 0, "Override the preset's depth (0: keep).")
_PARAM_DTYPE = flags.DEFINE_string("param_dtype", "", "Parameter dtype (default: preset's).")
_DTYPE = flags.DEFINE_string("dtype", "", "Compute dtype (default: preset's).")
_MESH_AXES = flags.DEFINE_list("mesh_axes", list(mesh_lib.DEFAULT_MESH_AXES), "Mesh axes.")
_ICI = flags.DEFINE_string("ici", "fsdp=-1", "Trainer mesh sizes, `axis=size,...` (-1: auto).")
_SAMPLE_ICI = flags.DEFINE_string(
  "sample_ici", "", "Sampler mesh sizes over the same devices (default: the trainer mesh).")
_TRAIN_RULES = flags.DEFINE_string("train_rules", "fsdp_tensor", "Trainer rule table.")
_SAMPLE_RULES = flags.DEFINE_string("sample_rules", "tensor", "Sampler rule table.")
_BATCH = flags.DEFINE_integer("batch", 8, "Rollouts per update (global).")
_MICRO = flags.DEFINE_integer("num_micro_batches", 1, "Gradient accumulation steps.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens.")
_COMPLETION_LEN = flags.DEFINE_integer("completion_len", 64, "Completion tokens (update).")
_SAMPLE_BATCH = flags.DEFINE_integer("sample_batch", 8, "Rows decoded together (global).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Decode budget (cache = prompt + this).")
_NUM_CPU = flags.DEFINE_integer("num_cpu_devices", 8, "Fake CPU devices (CPU backend only).")
_TOPOLOGY = flags.DEFINE_string(
  "topology", "", "Compile for a TPU topology you do not hold, e.g. v5p:2x2x2 (needs libtpu).")
_SCAN_LAYERS = flags.DEFINE_boolean(
  "scan_layers", None, "Layers under scan (--scan_layers / --noscan_layers; default: preset's).")
_REMAT = flags.DEFINE_string(
  "remat_policy", "", "Layer rematerialisation: none, full or dots (default: the preset's).")
_MOMENTS = flags.DEFINE_string(
  "moments_dtype", "float32", "Adam moments: 'float32' (the binaries' default) or 'params'.")
_OPTIMIZER = flags.DEFINE_string(
  "optimizer", "adamw", "The update rule: 'adamw' (default: clipped AdamW at a constant rate, the "
  "numbers of docs/benchmarks.md) or any other `setup.OPTIMIZERS` name, built by "
  "`setup.build_optimizer` with `base_configs.optimizer_config` defaults (e.g. 'muon_lion', "
  "Falcon Perception-HD's Muon + Lion split).")
_GCPO_K = flags.DEFINE_integer(
  "gcpo_k", 0, "> 0: chain GCPO's update projection (protected rank k) after AdamW, as "
  "config.update_constraint does (models.subspace.gcpo_projection).")
_SKIP = flags.DEFINE_list("skip", [], "Programs to skip: train_step, prefill, decode_step.")
_LORA_RANK = flags.DEFINE_integer(
  "lora_rank", 0, "> 0: the LoRA train step (adapters of this rank trained, base frozen), as "
  "config.lora does (models.lora).")
_LORA_ALPHA = flags.DEFINE_float("lora_alpha", 16.0, "LoRA scale numerator (scale = alpha/rank).")
_LORA_TARGETS = flags.DEFINE_list("lora_targets", list(DEFAULT_TARGETS),
                                  "Projections that get adapters.")
_ATTENTION = flags.DEFINE_string(
  "attention_impl", "", "Attention kernel (default: the preset's, 'auto').")
_CHUNK = flags.DEFINE_integer(
  "logit_chunk_size", -1, "Completion positions per logit chunk (-1: the preset's; 0: one chunk).")
_CACHE = flags.DEFINE_string(
  "compilation_cache_dir", "", "Persistent compilation cache, as the binaries use it "
  "(`config.compilation_cache_dir`); run twice to time a warm start. '' (default): none.")


def _sizes(text: str) -> dict[str, int]:
  sizes = {}
  for item in filter(None, text.split(",")):
    name, _, value = item.partition("=")
    sizes[name.strip()] = int(value)
  return sizes


def _devices():
  if _TOPOLOGY.value:
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(_TOPOLOGY.value, platform="tpu").devices)
  # Before the first device query: lets a CPU host pretend to be a pod.
  jax.config.update("jax_num_cpu_devices", _NUM_CPU.value)
  return jax.devices()


def _abstract(tree, shardings):
  """ShapeDtypeStructs that carry shardings: what `lower` compiles against."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      tree, shardings)


def _bytes_per_device(tree, shardings) -> int:
  total = 0
  for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    total += math.prod(s.shard_shape(a.shape)) * jnp.dtype(a.dtype).itemsize
  return total


def _memory(compiled) -> dict:
  try:
    stats = compiled.memory_analysis()
  except (NotImplementedError, jax.errors.JaxRuntimeError):
    stats = None
  names = ("temp", "argument", "output", "alias", "generated_code")
  return {f"{n}_bytes": getattr(stats, f"{n}_size_in_bytes", None) for n in names}


def _compile(fn, *args):
  tic = time.perf_counter()
  lowered = fn.lower(*args)
  lower_s = time.perf_counter() - tic
  tic = time.perf_counter()
  compiled = lowered.compile()
  return compiled, {"lower_s": round(lower_s, 2),
                    "compile_s": round(time.perf_counter() - tic, 2)}


def _batch_struct(mesh, rules, shape, dtype):
  names = (axes.BATCH,) + (None,) * (len(shape) - 1)
  return jax.ShapeDtypeStruct(shape, dtype, sharding=logical_sharding(names, mesh, rules, shape))


def train_step_report(model_config, graphdef, abstract_params, mesh, rules) -> dict:
  """Lowers and compiles one GRPO update against abstract, sharded inputs (with
  `--lora_rank`, the update of adapters on the frozen base)."""
  frozen = None
  if _LORA_RANK.value:
    def make():
      model = CausalLM(model_config, rngs=nnx.Rngs(0))
      return add_lora(model, rank=_LORA_RANK.value, alpha=_LORA_ALPHA.value,
                      targets=tuple(_LORA_TARGETS.value), rngs=nnx.Rngs(1))

    graphdef, abstract_params, abstract_frozen = nnx.split(nnx.eval_shape(make), LoraParam, ...)
    frozen_shardings = state_shardings(abstract_frozen, mesh, rules)
    frozen = _abstract(abstract_frozen, frozen_shardings)
  if _MOMENTS.value not in ("float32", "params"):
    raise ValueError(f"--moments_dtype={_MOMENTS.value!r}: expected 'float32' or 'params'")
  if _OPTIMIZER.value == "adamw":
    stages = [optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.0)]
    if _GCPO_K.value > 0:
      stages.append(run_setup.update_constraint(ml_collections.ConfigDict(dict(
        name="gcpo", k=_GCPO_K.value, mode="bilateral", targets=subspace.DEFAULT_TARGETS))))
    optimizer = optax.chain(*stages)
    if _MOMENTS.value == "float32":  # What the binaries do (`optimizer.moments_dtype`).
      optimizer = run_setup.with_float32_state(optimizer)
  else:
    # The binaries' own optimizer, as `config.optimizer.name` builds it (its moments dtype too).
    if _GCPO_K.value > 0:
      raise ValueError("--gcpo_k is compiled with --optimizer=adamw only")
    if _OPTIMIZER.value not in run_setup.OPTIMIZERS:
      raise ValueError(f"--optimizer={_OPTIMIZER.value!r}: expected one of "
                       f"{', '.join(run_setup.OPTIMIZERS)}")
    config = ml_collections.ConfigDict(dict(optimizer=base_configs.optimizer_config(
      lr=1e-6, name=_OPTIMIZER.value, decay_steps=10**9, moments_dtype=_MOMENTS.value)))
    optimizer = run_setup.build_optimizer(config, total_steps=1)

  def init(params):
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params),
                      rng=jax.random.key_data(jax.random.key(0)),
                      nonfinite_streak=jnp.zeros((), jnp.int32),
                      nonfinite_total=jnp.zeros((), jnp.int32))

  abstract_state = jax.eval_shape(init, abstract_params)
  shardings = train_state_shardings(abstract_state, mesh, rules)
  state = _abstract(abstract_state, shardings)
  b, p, t = _BATCH.value, _PROMPT_LEN.value, _COMPLETION_LEN.value
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  batch = dict(
    prompt_tokens=_batch_struct(mesh, rules, (b, p), jnp.int32),
    prompt_mask=_batch_struct(mesh, rules, (b, p), jnp.bool_),
    completion_tokens=_batch_struct(mesh, rules, (b, t), jnp.int32),
    completion_mask=_batch_struct(mesh, rules, (b, t), jnp.bool_),
    adv=_batch_struct(mesh, rules, (b,), jnp.float32),
    old_logp=_batch_struct(mesh, rules, (b, t), jnp.float32),
    num_tokens=jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated),
    num_sequences=jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated))
  step = make_train_step(graphdef, make_policy_loss(policy_loss="grpo"), optimizer,
                         num_micro_batches=_MICRO.value, mesh=mesh, rules=rules,
                         shared=("num_tokens", "num_sequences"), frozen=frozen)
  compiled, times = _compile(step, state, batch)
  lora = {}
  if frozen is not None:
    lora = dict(lora_rank=_LORA_RANK.value, lora_targets=list(_LORA_TARGETS.value),
                frozen_bytes=_bytes_per_device(abstract_frozen, frozen_shardings))
  return dict(
    what="train_step", **times,
    params_bytes=_bytes_per_device(abstract_state.params, shardings.params),
    opt_state_bytes=_bytes_per_device(abstract_state.opt_state, shardings.opt_state),
    **_memory(compiled), batch=b, tokens_per_row=p + t, num_micro_batches=_MICRO.value,
    moments_dtype=_MOMENTS.value, optimizer=_OPTIMIZER.value, gcpo_k=_GCPO_K.value, **lora)


def decode_step_report(model_config, graphdef, abstract_params, mesh, rules) -> dict:
  """Lowers and compiles the sampler's decode loop (KV cache donated, as the sampler does)."""
  shardings = state_shardings(abstract_params, mesh, rules)
  params = _abstract(abstract_params, shardings)
  b, cache_len = _SAMPLE_BATCH.value, _PROMPT_LEN.value + _MAX_NEW.value
  model = nnx.merge(graphdef, abstract_params)
  abstract_cache = jax.eval_shape(lambda: model.init_cache(b, cache_len))
  # Per-layer buffers, or `[layers, ...]` ones for a scan_layers model: the
  # cache names its own logical axes (`KVCache.k_axes` / `v_axes`).
  cache_shardings = abstract_cache.shardings(mesh, rules)
  cache = _abstract(abstract_cache, cache_shardings)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  logits = jax.ShapeDtypeStruct((b, model_config.vocab_size), jnp.float32,
                                sharding=logical_sharding((axes.BATCH, axes.VOCAB), mesh, rules,
                                                          (b, model_config.vocab_size)))
  positions = _batch_struct(mesh, rules, (b,), jnp.int32)
  rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                             sharding=replicated)
  ids = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=replicated)
  scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)

  @functools.partial(jax.jit, donate_argnums=(1,))
  def decode(params, cache, logits, positions, rng, eos_ids, stop_ids, temperature, top_p):
    with axis_rules(mesh, rules):
      start = kernels.PrefillOutput(logits, positions, cache)
      return kernels.decode(graphdef, params, start, rng, max_new_tokens=_MAX_NEW.value,
                            eos_ids=eos_ids, stop_ids=stop_ids, pad_id=0,
                            temperature=temperature, top_p=top_p, top_k=0, greedy=False,
                            num_logprobs=0)

  compiled, times = _compile(decode, params, cache, logits, positions, rng, ids, ids, scalar,
                             scalar)
  return dict(what="decode_step", **times, params_bytes=_bytes_per_device(abstract_params,
                                                                           shardings),
              kv_cache_bytes=_bytes_per_device(abstract_cache, cache_shardings),
              **_memory(compiled), batch=b, cache_len=cache_len)


def prefill_report(model_config, graphdef, abstract_params, mesh, rules) -> dict:
  """Lowers and compiles the sampler's prefill: `--sample_batch` prompts of `--prompt_len`
  tokens into a cache of prompt + `--max_new_tokens` slots, one sample per prompt."""
  shardings = state_shardings(abstract_params, mesh, rules)
  params = _abstract(abstract_params, shardings)
  b, p = _SAMPLE_BATCH.value, _PROMPT_LEN.value
  tokens = _batch_struct(mesh, rules, (b, p), jnp.int32)
  mask = _batch_struct(mesh, rules, (b, p), jnp.bool_)

  @jax.jit
  def prefill(params, tokens, mask):
    with axis_rules(mesh, rules):
      return kernels.prefill(graphdef, params, tokens, mask, cache_len=p + _MAX_NEW.value,
                             num_samples=1)

  compiled, times = _compile(prefill, params, tokens, mask)
  return dict(what="prefill", **times, params_bytes=_bytes_per_device(abstract_params, shardings),
              **_memory(compiled), batch=b, prompt_len=p)


def _peak_rss_bytes() -> int:
  """This process's peak resident memory: proof that no model-sized buffer was allocated.

  Linux's `VmHWM` belongs to the current program image. `ru_maxrss` is not
  enough: it keeps the peak from before `exec`, and a child started with
  vfork or posix_spawn (Python's `subprocess` does this) inherits its
  parent's peak. A test suite worker that has grown to a few GB passes that
  peak on to the script.
  """
  try:
    with open("/proc/self/status") as status:
      for line in status:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024  # kB
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _apply_config_flags() -> None:
  """Sets the flags from `--config`; a flag also given on the command line keeps its value."""
  if _CONFIG.value is None:
    return
  for name, value in compile_sizes(_CONFIG.value).items():
    if not flags.FLAGS[name].present:
      flags.FLAGS[name].value = value


def main(argv):
  del argv
  _apply_config_flags()
  run_setup.enable_compilation_cache(_CACHE.value)
  devices = _devices()
  overrides = {}
  if _NUM_LAYERS.value:
    overrides["num_layers"] = _NUM_LAYERS.value
  if _PARAM_DTYPE.value:
    overrides["param_dtype"] = _PARAM_DTYPE.value
  if _DTYPE.value:
    overrides["dtype"] = _DTYPE.value
  if _ATTENTION.value:
    overrides["attention_impl"] = _ATTENTION.value
  if _CHUNK.value >= 0:
    overrides["logit_chunk_size"] = _CHUNK.value
  if _SCAN_LAYERS.value is not None:
    overrides["scan_layers"] = _SCAN_LAYERS.value
  if _REMAT.value:
    overrides["remat_policy"] = _REMAT.value
  model_config = get_model_config(_MODEL.value, **overrides)
  config = mesh_lib.mesh_config(_MESH_AXES.value, ici=_sizes(_ICI.value),
                                train_rules=_TRAIN_RULES.value, sample_rules=_SAMPLE_RULES.value)
  train_mesh = mesh_lib.make_mesh(config, devices=devices, key="--ici")
  sample_mesh = train_mesh
  if _SAMPLE_ICI.value:
    sample_config = mesh_lib.mesh_config(_MESH_AXES.value, ici=_sizes(_SAMPLE_ICI.value))
    sample_mesh = mesh_lib.make_mesh(sample_config, devices=devices, key="--sample_ici")
  tic = time.perf_counter()
  graphdef, abstract_params = mesh_lib.abstract_module(
    lambda: CausalLM(model_config, rngs=nnx.Rngs(0)))
  common = dict(model=_MODEL.value, num_layers=model_config.num_layers,
                num_params=model_config.num_params(),
                param_dtype=str(model_config.param_dtype), num_devices=len(devices),
                platform=devices[0].platform, abstract_init_s=round(time.perf_counter() - tic, 2))
  if "train_step" not in _SKIP.value:
    rules = mesh_lib.get_rules(_TRAIN_RULES.value, key="--train_rules")
    report = train_step_report(model_config, graphdef, abstract_params, train_mesh, rules)
    print(json.dumps(dict(report, mesh=dict(train_mesh.shape), rules=_TRAIN_RULES.value,
                          peak_rss_bytes=_peak_rss_bytes(), **common)), flush=True)
  if "prefill" not in _SKIP.value:
    rules = mesh_lib.get_rules(_SAMPLE_RULES.value, key="--sample_rules")
    report = prefill_report(model_config, graphdef, abstract_params, sample_mesh, rules)
    print(json.dumps(dict(report, mesh=dict(sample_mesh.shape), rules=_SAMPLE_RULES.value,
                          peak_rss_bytes=_peak_rss_bytes(), **common)), flush=True)
  if "decode_step" not in _SKIP.value:
    rules = mesh_lib.get_rules(_SAMPLE_RULES.value, key="--sample_rules")
    report = decode_step_report(model_config, graphdef, abstract_params, sample_mesh, rules)
    print(json.dumps(dict(report, mesh=dict(sample_mesh.shape), rules=_SAMPLE_RULES.value,
                          peak_rss_bytes=_peak_rss_bytes(), **common)), flush=True)


if __name__ == "__main__":
  app.run(main)
