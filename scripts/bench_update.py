r"""One GRPO update at a real size: seconds, MFU and peak device memory, with a PyTorch reference.

  python scripts/bench_update.py              # qwen3_0p6b, 16 × (256 + 768), bf16
  python scripts/bench_update.py --batch=4    # the 24 GB / 17 % MFU case of issue 22
  python scripts/bench_update.py --model=tiny --batch=4 --prompt_len=8 --completion_len=24 \
      --peak_tflops=0 --torch_reference   # CPU smoke run (tests/scripts/test_bench_scripts.py)

The update is the one the binaries run: `make_train_step` (forward + backward
+ clipped AdamW, float32 moments unless `--moments_dtype=params`) with the
GRPO loss (`training.objectives.make_policy_loss`), on random tokens and weights, with the
preset's scan / remat / logit-chunk / attention settings unless a flag
overrides them. Prints JSON lines:

  {"what": "matmul_peak", ...}                      # in-run reference, compute dtype
  {"what": "update", "engine": "jaxrl_post", "seconds": ..., "tokens_per_s": ...,
   "mfu": ..., "mfu_in_run": ..., "peak_bytes": ..., "compile_s": ...}
  {"what": "update", "engine": "torch", ...}        # with --torch_reference
  {"what": "update_ratio", "speedup": ...}

MFU = 3 × forward FLOPs (`ModelConfig.flops_per_token` at the row length,
causal attention counted in full) × tokens / seconds / peak: `--peak_tflops`
(989 = an H100/H200's dense bf16 peak) and the matmul measured in the same run
(`mfu_in_run`). Rematerialised FLOPs are not counted, as usual for MFU.
`peak_bytes` is the device's `memory_stats()["peak_bytes_in_use"]` where the
backend reports it (GPU, TPU), else null. The reference is PyTorch eager
`transformers` (`Qwen3ForCausalLM` etc. built from `config_to_hf`, same batch,
same dtype, loss = masked token log-likelihood, `torch.optim.AdamW`), on CUDA
when available.

Imports only the model, losses and train step (no data stack), so the script
runs on a machine with jax, flax, optax, ml_collections (and torch +
transformers for the reference).
"""

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx

from jaxrl_post.benchmarking import matmul_peak
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import config_to_hf
from jaxrl_post.training.objectives import make_policy_loss
from jaxrl_post.training.setup import with_float32_state
from jaxrl_post.training.train_state import create_train_state, make_train_step

_MODEL = flags.DEFINE_string("model", "qwen3_0p6b", "Model preset.")
_NUM_LAYERS = flags.DEFINE_integer("num_layers", 0, "Override the preset's depth (0: keep).")
_BATCH = flags.DEFINE_integer("batch", 16, "Rows per update.")
_PROMPT = flags.DEFINE_integer("prompt_len", 256, "Prompt tokens per row.")
_COMPLETION = flags.DEFINE_integer("completion_len", 768, "Completion tokens per row.")
_MICRO = flags.DEFINE_integer("num_micro_batches", 1, "Gradient accumulation steps.")
_PARAM_DTYPE = flags.DEFINE_string("param_dtype", "bfloat16", "Parameter dtype.")
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "Compute dtype.")
_MOMENTS = flags.DEFINE_enum("moments_dtype", "float32", ["float32", "params"],
                             "Adam moments: float32 (the binaries' default) or the params'.")
_REMAT = flags.DEFINE_string("remat_policy", "", "Override the preset's remat policy.")
_CHUNK = flags.DEFINE_integer("logit_chunk_size", -1, "Override the preset's logit chunk.")
_ATTENTION = flags.DEFINE_string("attention_impl", "", "Override the preset's attention.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed updates (after one compile step).")
_PEAK = flags.DEFINE_float("peak_tflops", 989.0, "Device peak for MFU (0: in-run only).")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 8192, "Size of the in-run matmul reference.")
_TORCH = flags.DEFINE_bool("torch_reference", False, "Also time PyTorch eager transformers.")


def _batch(config, rng: np.random.Generator) -> dict:
  b, p, t = _BATCH.value, _PROMPT.value, _COMPLETION.value
  prompt_mask = np.ones((b, p), bool)
  prompt_mask[:, : p // 8] = False  # some left padding, as real prompts have
  return dict(
    prompt_tokens=jnp.asarray(rng.integers(0, config.vocab_size, (b, p)), jnp.int32),
    prompt_mask=jnp.asarray(prompt_mask),
    completion_tokens=jnp.asarray(rng.integers(0, config.vocab_size, (b, t)), jnp.int32),
    completion_mask=jnp.ones((b, t), bool),
    adv=jnp.asarray(rng.normal(size=b), jnp.float32),
    old_logp=jnp.full((b, t), -12.0, jnp.float32),
    num_tokens=jnp.float32(b * t), num_sequences=jnp.float32(b))


def _peak_bytes():
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def _report(engine, seconds, compile_s, config, reference, peak_bytes):
  b, s = _BATCH.value, _PROMPT.value + _COMPLETION.value
  flops = 3 * config.flops_per_token(s) * b * s
  row = dict(what="update", engine=engine, model=_MODEL.value, batch=b, seq_len=s,
             param_dtype=_PARAM_DTYPE.value, dtype=_DTYPE.value, seconds=seconds,
             tokens_per_s=b * s / seconds, tflops=flops / seconds / 1e12,
             mfu=flops / seconds / (_PEAK.value * 1e12) if _PEAK.value else None,
             mfu_in_run=flops / seconds / reference["flops_per_s"], peak_bytes=peak_bytes,
             compile_s=compile_s, backend=jax.default_backend())
  print(json.dumps(row), flush=True)
  return row


def _ours(config, reference):
  model = CausalLM(config, rngs=nnx.Rngs(0))
  graphdef = nnx.split(model)[0]
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
  if _MOMENTS.value == "float32":
    optimizer = with_float32_state(optimizer)
  state = create_train_state(model, optimizer, jax.random.key(0))
  del model  # The train state holds its own copy of the parameters.
  step = make_train_step(graphdef, make_policy_loss(policy_loss="grpo"), optimizer,
                         num_micro_batches=_MICRO.value, shared=("num_tokens", "num_sequences"))
  batch = _batch(config, np.random.default_rng(0))
  tic = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - tic
  times = []
  for _ in range(_STEPS.value):
    tic = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - tic)
  if not np.isfinite(float(metrics["loss"])):
    raise RuntimeError(f"non-finite loss {float(metrics['loss'])}")
  return _report("jaxrl_post", float(np.median(times)), compile_s, config, reference,
                 _peak_bytes())


def _torch(config, reference):
  import torch
  import transformers

  device = "cuda" if torch.cuda.is_available() else "cpu"
  dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32,
           "float16": torch.float16}[_PARAM_DTYPE.value]
  hf = transformers.AutoConfig.for_model(**config_to_hf(config))
  model = transformers.AutoModelForCausalLM.from_config(hf, dtype=dtype).to(device)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
  rng = np.random.default_rng(0)
  b, p, t = _BATCH.value, _PROMPT.value, _COMPLETION.value
  ids = torch.as_tensor(rng.integers(0, config.vocab_size, (b, p + t)), device=device)
  mask = torch.ones_like(ids)
  mask[:, : p // 8] = 0

  def step():
    logits = model(input_ids=ids, attention_mask=mask).logits[:, p - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, p:, None])[..., 0]
    loss = -logp.mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
      torch.cuda.synchronize()

  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
  tic = time.perf_counter()
  step()
  compile_s = time.perf_counter() - tic
  times = []
  for _ in range(_STEPS.value):
    tic = time.perf_counter()
    step()
    times.append(time.perf_counter() - tic)
  peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
  return _report("torch", float(np.median(times)), compile_s, config, reference, peak)


def main(argv):
  del argv
  overrides = dict(param_dtype=_PARAM_DTYPE.value, dtype=_DTYPE.value)
  if _NUM_LAYERS.value:
    overrides["num_layers"] = _NUM_LAYERS.value
  if _REMAT.value:
    overrides["remat_policy"] = _REMAT.value
  if _CHUNK.value >= 0:
    overrides["logit_chunk_size"] = _CHUNK.value
  if _ATTENTION.value:
    overrides["attention_impl"] = _ATTENTION.value
  config = get_model_config(_MODEL.value, **overrides)
  reference = matmul_peak(_MATMUL_N.value, dtype=_DTYPE.value)
  print(json.dumps(reference), flush=True)
  ours = _ours(config, reference)
  if _TORCH.value:
    # JAX keeps its preallocated pool; torch gets what is left (set
    # XLA_PYTHON_CLIENT_MEM_FRACTION to share a GPU evenly).
    theirs = _torch(config, reference)
    print(json.dumps(dict(what="update_ratio", speedup=theirs["seconds"] / ours["seconds"])),
          flush=True)


if __name__ == "__main__":
  os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
  app.run(main)
