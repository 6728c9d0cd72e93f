r"""Forward throughput of the decoder LM, against a matmul peak measured in the same run.

  python scripts/bench_model.py                      # CPU defaults, ~1 minute
  python scripts/bench_model.py --batch=8 --seq_len=256 --repeats=5 \
      --models=small,qwen3_0p6b:num_layers=2,llama3p2_1b:num_layers=2

Prints one JSON line per measurement:
  {"what": "matmul_peak", ...}         float32 [n, n] @ [n, n], the reference
  {"what": "forward", "model": ..., "tokens_per_s": ..., "tflops": ...,
   "fraction_of_matmul_peak": ...}

FLOPs per token are `ModelConfig.flops_per_token(seq_len)`: 2 per matmul
weight plus q·k and p·v over the full `seq_len` keys (what a masked dense
attention executes).
"""

import json

import jax
import jax.numpy as jnp
from absl import app, flags
from flax import nnx

from jaxrl_post.benchmarking import matmul_peak, median_seconds
from jaxrl_post.models import CausalLM, get_model_config

_MODELS = flags.DEFINE_list(
  "models", ["small", "qwen3_0p6b:num_layers=2"],
  "Presets, optionally with `:field=value` overrides (reduced-depth variants).")
_ATTENTION = flags.DEFINE_list("attention_impl", ["xla", "plain"], "Attention paths to time.")
_BATCH = flags.DEFINE_integer("batch", 4, "Rows per forward.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 2048, "Matrix size of the peak reference.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls (after one warm-up).")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter and compute dtype.")


def _parse(spec: str):
  name, _, rest = spec.partition(":")
  overrides = {}
  for item in filter(None, rest.split(",")):
    key, value = item.split("=")
    overrides[key] = int(value)
  return name, overrides


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  reference = matmul_peak(_MATMUL_N.value, _DTYPE.value, _REPEATS.value)
  peak = reference["flops_per_s"]
  print(json.dumps(reference), flush=True)

  b, t = _BATCH.value, _SEQ_LEN.value
  tokens = jax.random.randint(jax.random.key(1), (b, t), 0, 256)
  for spec in _MODELS.value:
    name, overrides = _parse(spec)
    for impl in _ATTENTION.value:
      config = get_model_config(name, **overrides, param_dtype=dtype, dtype=dtype,
                                attention_impl=impl)
      model = CausalLM(config, rngs=nnx.Rngs(0))
      graphdef, state = nnx.split(model)
      forward = jax.jit(lambda state, tokens, g=graphdef: nnx.merge(g, state)(tokens))
      seconds = median_seconds(
        lambda f=forward, s=state: jax.block_until_ready(f(s, tokens)), _REPEATS.value)
      flops = b * t * config.flops_per_token(t) / seconds
      print(json.dumps({
        "what": "forward", "model": spec, "attention_impl": impl, "dtype": _DTYPE.value,
        "params_m": round(config.num_params() / 1e6, 2), "batch": b, "seq_len": t,
        "seconds": seconds, "tokens_per_s": b * t / seconds, "tflops": flops / 1e12,
        "fraction_of_matmul_peak": flops / peak}), flush=True)


if __name__ == "__main__":
  app.run(main)
