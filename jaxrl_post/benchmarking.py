"""Helpers shared by `scripts/bench_*.py` and `aot_compile.py`: median wall clock, a matmul peak,
and the sizes an experiment config compiles.

Every benchmark reports its throughput against a reference measured in the
same process (a dense float matmul), so numbers from different machines, or
from one machine under different load, can be compared as fractions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int = 3) -> float:
  """Median wall clock of `fn()` over `repeats` calls, after one untimed warm-up call.

  `fn` must block until its work is done (`jax.block_until_ready`).
  """
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def matmul_peak(n: int = 2048, dtype: str = "float32", repeats: int = 3,
                mesh: jax.sharding.Mesh | None = None) -> dict:
  """FLOP/s of a jitted `[n, n] @ [n, n]`: the reference for MFU.

  On the default device; with `mesh`, every device of the mesh multiplies its own
  `[n, n]` block at once (`[devices · n, n] @ [n, n]`, rows split over all the mesh's
  axes), so the reference covers the devices a benchmark spreads its batch over
  (e.g. one single-threaded CPU device per core, `parallel.host.use_one_cpu_device_per_core`).
  """
  devices = 1 if mesh is None else mesh.size
  a = jax.random.normal(jax.random.key(0), (devices * n, n), jnp.dtype(dtype))
  b = a[:n]
  if mesh is not None:
    rows = jax.sharding.PartitionSpec(tuple(mesh.axis_names))
    a = jax.device_put(a, jax.sharding.NamedSharding(mesh, rows))
    b = jax.device_put(b, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  matmul = jax.jit(lambda a, b: a @ b)
  seconds = median_seconds(lambda: matmul(a, b).block_until_ready(), repeats)
  flops = 2 * devices * n**3
  return {"what": "matmul_peak", "n": n, "dtype": dtype, "seconds": seconds,
          "flops_per_s": flops / seconds, "tflops": flops / seconds / 1e12,
          "backend": jax.default_backend(), "devices": devices}


def compile_sizes(config) -> dict:
  """What an experiment config's binary compiles, as `scripts/aot_compile.py` flag values.

  The update compiles one PPO mini-batch (`prompts_per_step × group_size / ppo_mini_batches`
  rows, split into `num_micro_batches`) of `prompt_len + max_new_tokens` tokens; the sampler
  decodes the step's rollouts (`prompts_per_step × group_size` rows). Unset run options
  (`scan_layers`, `remat_policy`, ...) stay the preset's. A `config.lora` block with rank > 0
  gives the LoRA update (`lora_rank`, `lora_alpha`, `lora_targets`).

  Raises:
    ValueError: naming the config key whose rows do not divide.
  """
  rollouts = config.prompts_per_step * config.group_size
  if rollouts % config.ppo_mini_batches:
    raise ValueError(f"config.ppo_mini_batches={config.ppo_mini_batches} does not divide the "
                     f"{rollouts} rollouts of a step")
  mesh = config.mesh
  values = dict(
    model=config.model, param_dtype=config.param_dtype, dtype=config.dtype,
    batch=rollouts // config.ppo_mini_batches, num_micro_batches=config.num_micro_batches,
    prompt_len=config.prompt_len, completion_len=config.max_new_tokens,
    max_new_tokens=config.max_new_tokens, sample_batch=rollouts,
    moments_dtype=config.optimizer.get("moments_dtype", "float32"),
    optimizer=config.optimizer.get("name", "adamw"),
    mesh_axes=list(mesh.mesh_axes),
    ici=",".join(f"{a}={mesh[f'ici_{a}']}" for a in mesh.mesh_axes),
    train_rules=mesh.train_rules, sample_rules=mesh.sample_rules)
  # One slice: the sizes within it are the whole mesh (`dcn_*` multiply them across slices).
  if all(mesh[f"ici_{a}"] > 0 for a in mesh.mesh_axes):
    values["num_cpu_devices"] = math.prod(mesh[f"ici_{a}"] for a in mesh.mesh_axes)
  if config.get("scan_layers") is not None:
    values["scan_layers"] = config.scan_layers
  if config.get("remat_policy"):
    values["remat_policy"] = config.remat_policy
  if config.get("logit_chunk_size") is not None:
    values["logit_chunk_size"] = config.logit_chunk_size
  if config.get("attention_impl"):
    values["attention_impl"] = config.attention_impl
  lora = config.get("lora")
  if lora and lora.get("rank", 0):
    values.update(lora_rank=int(lora.rank), lora_alpha=float(lora.alpha),
                  lora_targets=list(lora.targets))
  return values
