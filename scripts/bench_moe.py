r"""Dense vs ragged MoE dispatch: time, compiled memory and agreement of one sparse block.

  python scripts/bench_moe.py                                   # CPU defaults, ~2 minutes
  python scripts/bench_moe.py --tokens=1024 --embed=2048 --moe_mlp=768 --experts=128 \
      --top_k=8 --aot_only                                      # a Qwen3-30B-A3B layer, shapes only

`models/moe.py` has two dispatches of the same block (`ModelConfig.moe_impl`): "dense" runs
every expert on every token and combines with the `[N, E]` combine tensor (E/k × the active
FLOPs); "ragged" sorts the N·k token-slots by expert and runs `jax.lax.ragged_dot` (grouped
matmul). Which one is cheaper depends on E/k and on how the backend lowers `ragged_dot`, so
this script measures both on the same inputs, forward + backward of Σ y² through the block
(the router included), against a `[n, n] @ [n, n]` matmul measured in the same run:

  {"what": "matmul_peak", ...}
  {"what": "moe_block", "impl": "dense" | "ragged", "experts": E, "top_k": k, "tokens": N,
   "seconds": fwd+bwd median, "active_tflops": FLOPs of the routed work / s,
   "fraction_of_matmul_peak": ..., "temp_bytes": XLA's temporaries of the compiled step,
   "compile_seconds": ..., "max_abs_diff_vs_dense": output difference on the same input}

Active FLOPs per step: 3 (fwd + 2 bwd) × 3 matmuls × 2·N·k·d·f (the router's N·d·E aside).
"""

import json
import time

import jax
import jax.numpy as jnp
from absl import app, flags
from flax import nnx

from jaxrl_post.benchmarking import matmul_peak, median_seconds
from jaxrl_post.models import get_model_config
from jaxrl_post.models.moe import MoEBlock

_TOKENS = flags.DEFINE_integer("tokens", 2048, "Tokens N through the block (batch × time).")
_EMBED = flags.DEFINE_integer("embed", 256, "Model width d.")
_MOE_MLP = flags.DEFINE_integer("moe_mlp", 128, "Each expert's hidden width f.")
_EXPERTS = flags.DEFINE_list("experts", ["8", "16", "64", "128"], "Expert counts E to sweep.")
_TOP_K = flags.DEFINE_integer("top_k", 2, "Experts per token k.")
_IMPLS = flags.DEFINE_list("impls", ["dense", "ragged"], "Dispatches to measure.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter and compute dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls (after one warm-up).")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 2048, "Matrix size of the peak reference.")
_AOT_ONLY = flags.DEFINE_bool("aot_only", False, "Compile and report memory, do not run.")


def _block(num_experts: int, impl: str):
  config = get_model_config(
    "qwen3_moe_tiny", embed_dim=_EMBED.value, moe_mlp_dim=_MOE_MLP.value,
    num_experts=num_experts, num_experts_per_tok=_TOP_K.value, moe_impl=impl,
    param_dtype=_DTYPE.value, dtype=_DTYPE.value)
  return nnx.split(MoEBlock(config, rngs=nnx.Rngs(0)))


def _step(graphdef):
  def loss(params, x):
    y, _ = nnx.merge(graphdef, params)(x)
    return jnp.sum(jnp.square(y.astype(jnp.float32)))
  return jax.jit(jax.value_and_grad(loss))


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  peak = None
  if not _AOT_ONLY.value:
    reference = matmul_peak(_MATMUL_N.value, _DTYPE.value, _REPEATS.value)
    peak = reference["flops_per_s"]
    print(json.dumps(reference), flush=True)
  n, d, f, k = _TOKENS.value, _EMBED.value, _MOE_MLP.value, _TOP_K.value
  x = jax.random.normal(jax.random.key(1), (1, n, d), dtype)
  active_flops = 3 * 3 * 2 * n * k * d * f
  for num_experts in map(int, _EXPERTS.value):
    outputs = {}
    for impl in _IMPLS.value:
      # Same seed, same parameter shapes: both dispatches see identical weights.
      graphdef, params = _block(num_experts, impl)
      step = _step(graphdef)
      start = time.perf_counter()
      compiled = step.lower(params, x).compile()
      compile_seconds = time.perf_counter() - start
      memory = compiled.memory_analysis()
      row = {"what": "moe_block", "impl": impl, "experts": num_experts, "top_k": k,
             "tokens": n, "embed": d, "moe_mlp": f, "dtype": _DTYPE.value,
             "backend": jax.default_backend(), "compile_seconds": round(compile_seconds, 3),
             "temp_bytes": int(memory.temp_size_in_bytes) if memory else None,
             "argument_bytes": int(memory.argument_size_in_bytes) if memory else None}
      if not _AOT_ONLY.value:
        seconds = median_seconds(
          lambda c=compiled, p=params: jax.block_until_ready(c(p, x)), _REPEATS.value)
        outputs[impl] = nnx.merge(graphdef, params)(x)[0]
        row.update(seconds=seconds, active_tflops=active_flops / seconds / 1e12,
                   fraction_of_matmul_peak=active_flops / seconds / peak)
        if "dense" in outputs:
          row["max_abs_diff_vs_dense"] = float(
            jnp.max(jnp.abs(outputs[impl].astype(jnp.float32)
                            - outputs["dense"].astype(jnp.float32))))
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  app.run(main)
