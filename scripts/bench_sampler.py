r"""Sampler throughput: jaxrl_post vs Hugging Face `transformers.generate`, same run.

  python scripts/bench_sampler.py                 # CPU: `small`, batch 64, prompt 64, 128 new
  python scripts/bench_sampler.py --cpu_devices=0 # CPU, one XLA device with its thread pool
  python scripts/bench_sampler.py --skip_transformers --model=qwen3_0p6b   # on a GPU

One JSON line per measurement:
  {"what": "sampler", "engine": "jaxrl_post" | "transformers", "case": "n1" | "n8", ...,
   "prefill_tokens_per_s", "ttft_s", "decode_tokens_per_s", "total_s"}
  {"what": "sampler_ratio", "case": ..., "decode_speedup": ours / transformers, ...}

Both engines sample at temperature 1 over the full vocabulary with the KV cache,
never stop early (no EOS), and run the same architecture and sizes (random
weights; speed does not depend on them). Case "n1": 64 distinct prompts;
case "n8": 8 prompts × 8 samples (we prefill once per prompt and copy the
cache; transformers expands the prompts with `num_return_sequences`).
On CPU the host is split into one single-threaded XLA device per core
(`parallel.host`) and the rows are sharded over them with replicated
parameters, which is how the sampler uses several cores; transformers gets
the same cores as intra-op threads. The two engines are timed in alternating
rounds, so that a drift of the host's speed falls on both; decode is timed on
its own in each round (ours after an untimed prefill; transformers from a
logits-processor clock inside one `generate`). On a GPU the script adds the decode rate
as a fraction of the HBM-bandwidth roofline, with the bandwidth measured by a
device copy in the same run.
"""

import json
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_post.benchmarking import median_seconds
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.parallel import host
from jaxrl_post.parallel.mesh import REPLICATED_RULES
from jaxrl_post.sampling import Sampler
from jaxrl_post.sampling.sampler import end_id_array, jitted_decode, jitted_prefill

_MODEL = flags.DEFINE_string("model", "small", "Model preset.")
_BATCH = flags.DEFINE_integer("batch", 64, "Rows generated together.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 128, "Generated tokens per row.")
_GROUP = flags.DEFINE_integer("group", 8, "Samples per prompt in the second case.")
_REPEATS = flags.DEFINE_integer(
  "repeats", 3, "Timed rounds per engine (median), after a warm-up round; engines alternate.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter / compute dtype.")
_SKIP_HF = flags.DEFINE_bool("skip_transformers", False, "Only time jaxrl_post.")
_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", -1, "CPU only: split the host into this many single-threaded devices and shard "
  "the batch over them (-1: one per core; 0: XLA's default, one device with a thread pool).")


def _timed(fn, *args) -> tuple[float, object]:
  start = time.perf_counter()
  out = fn(*args)
  return time.perf_counter() - start, out


def _ours(model, prompts: np.ndarray, n: int, mesh) -> Callable[[], dict[str, float]]:
  """One timed round of jaxrl_post: prefill (TTFT), decode alone, and a whole `generate`."""
  sampler = Sampler(model, max_prompt_len=prompts.shape[1], eos_ids=[], mesh=mesh,
                    rules=REPLICATED_RULES)
  state = nnx.state(model)
  if mesh is not None:
    state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
  tokens, mask, _ = sampler._pad_prompts(prompts.tolist())
  tokens, mask = sampler._put_batch(tokens, mask)
  t = _NEW_TOKENS.value
  cache_len = tokens.shape[1] + t
  static = sampler._static
  end, stop = end_id_array([], "eos"), end_id_array([], "stop")

  def prefill():
    return jax.block_until_ready(jitted_prefill(state, tokens, mask, cache_len=cache_len,
                                          num_samples=n, **static))

  def decode(start):
    return jax.block_until_ready(jitted_decode(
      state, start.cache, start.logits, start.positions, jax.random.key(0), end, stop,
      jnp.float32(1.0), jnp.float32(1.0), max_new_tokens=t, top_k=0, greedy=False,
      num_logprobs=0, pad_id=0, **static))

  def generate():
    return sampler.generate(state, prompts.tolist(), n_samples_per_prompt=n, max_new_tokens=t,
                            rng=jax.random.key(1)).completion_tokens.block_until_ready()

  def one_round():
    ttft, start = _timed(prefill)
    decode_s, _ = _timed(decode, start)  # timed on its own: a fresh prefill, the cache is donated
    total, _ = _timed(generate)
    return dict(ttft_s=ttft, decode_s=decode_s, total_s=total)

  return one_round


def _transformers(config, prompts: np.ndarray, n: int) -> Callable[[], dict[str, float]]:
  """One timed round of `transformers.generate`: 1 new token (TTFT), then all of them."""
  import torch
  import transformers

  from jaxrl_post.models.hf import config_to_hf

  hf_config = config_to_hf(config)
  hf_config.update(eos_token_id=None, bos_token_id=None, pad_token_id=0)
  hf_class = getattr(transformers, f"{hf_config['architectures'][0][:-len('ForCausalLM')]}Config")
  model = transformers.AutoModelForCausalLM.from_config(hf_class(**hf_config)).eval()
  model = model.to(getattr(torch, _DTYPE.value))
  ids = torch.tensor(prompts, dtype=torch.long)
  attention = torch.ones_like(ids)
  stamps = []

  def stamp(input_ids, scores):
    # Called once per new token, after the forward that made its logits: the
    # first call follows prefill, the last follows the (t - 1)-th decode step.
    stamps.append(time.perf_counter())
    return scores

  def generate(new_tokens):
    stamps.clear()
    with torch.no_grad():
      model.generate(input_ids=ids, attention_mask=attention, do_sample=True, temperature=1.0,
                     top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                     num_return_sequences=n, use_cache=True, pad_token_id=0,
                     logits_processor=transformers.LogitsProcessorList([stamp]))
    return stamps[-1] - stamps[0]

  def one_round():
    ttft, _ = _timed(generate, 1)
    total, decode_s = _timed(generate, _NEW_TOKENS.value)
    return dict(ttft_s=ttft, decode_s=decode_s, total_s=total,
                torch_threads=torch.get_num_threads())

  return one_round


def _interleaved(rounds: dict[str, Callable[[], dict]]) -> dict[str, dict[str, float]]:
  """Per engine, the median of every timing (`*_s`) over `--repeats` rounds after a warm-up.

  The engines alternate round by round, so that a drift of the host's speed (±20 % within
  minutes on a shared VM) falls on both and cancels in their ratio.
  """
  for one_round in rounds.values():
    one_round()
  results = {name: [] for name in rounds}
  for _ in range(_REPEATS.value):
    for name, one_round in rounds.items():
      results[name].append(one_round())
  return {name: {key: float(np.median([r[key] for r in runs])) if key.endswith("_s")
                 else runs[0][key] for key in runs[0]}
          for name, runs in results.items()}


def _rates(timings: dict[str, float], prefill_tokens: int, rows: int) -> dict[str, float]:
  t = _NEW_TOKENS.value
  return dict(timings, prefill_tokens_per_s=prefill_tokens / timings["ttft_s"],
              decode_tokens_per_s=rows * (t - 1) / timings["decode_s"],
              total_tokens_per_s=rows * t / timings["total_s"])


def _hbm_bandwidth() -> float:
  x = jnp.ones((256 * 1024 * 1024,), jnp.float32)  # 1 GiB
  copy = jax.jit(lambda x: x * 1.0001)
  seconds = median_seconds(lambda: copy(x).block_until_ready(), _REPEATS.value)
  return 2 * x.nbytes / seconds  # read + write


def main(argv):
  del argv
  if _CPU_DEVICES.value != 0:
    host.use_one_cpu_device_per_core(None if _CPU_DEVICES.value < 0 else _CPU_DEVICES.value)
  mesh = host.data_mesh() if jax.device_count() > 1 else None
  config = get_model_config(_MODEL.value, param_dtype=_DTYPE.value, dtype=_DTYPE.value)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  rng = np.random.RandomState(0)
  g = _GROUP.value
  cases = {"n1": (_BATCH.value, 1), f"n{g}": (_BATCH.value // g, g)}
  common = dict(model=_MODEL.value, dtype=_DTYPE.value, batch=_BATCH.value,
                prompt_len=_PROMPT_LEN.value, max_new_tokens=_NEW_TOKENS.value,
                backend=jax.default_backend(), devices=jax.device_count())
  for case, (prompts_count, n) in cases.items():
    prompts = rng.randint(3, config.vocab_size, (prompts_count, _PROMPT_LEN.value))
    rounds = {"jaxrl_post": _ours(model, prompts, n, mesh)}
    if not _SKIP_HF.value:
      rounds["transformers"] = _transformers(config, prompts, n)
    timings = _interleaved(rounds)
    rows = prompts_count * n
    # We prefill each prompt once; transformers prefills its n expanded copies.
    ours = _rates(timings["jaxrl_post"], prompts.size, rows)
    row = dict(what="sampler", engine="jaxrl_post", case=case, **common, **ours)
    if jax.default_backend() == "gpu":
      # Each decode step reads every weight and the whole cache once.
      bandwidth = _hbm_bandwidth()
      mean_context = _PROMPT_LEN.value + _NEW_TOKENS.value / 2
      cache_bytes = (2 * config.num_layers * _BATCH.value * config.num_kv_heads * config.head_dim
                     * mean_context * jnp.dtype(config.dtype).itemsize)
      step_bytes = config.num_params() * jnp.dtype(config.param_dtype).itemsize + cache_bytes
      roofline = _BATCH.value * bandwidth / step_bytes
      row.update(hbm_bandwidth_gbs=bandwidth / 1e9, roofline_tokens_per_s=roofline,
                 fraction_of_roofline=ours["decode_tokens_per_s"] / roofline)
    print(json.dumps(row), flush=True)
    if _SKIP_HF.value:
      continue
    theirs = _rates(timings["transformers"], prompts.size * n, rows)
    print(json.dumps(dict(what="sampler", engine="transformers", case=case, **common, **theirs)),
          flush=True)
    print(json.dumps(dict(
      what="sampler_ratio", case=case,
      decode_speedup=ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"],
      prefill_speedup=ours["prefill_tokens_per_s"] / theirs["prefill_tokens_per_s"],
      ttft_ratio=theirs["ttft_s"] / ours["ttft_s"],
      total_speedup=theirs["total_s"] / ours["total_s"])), flush=True)


if __name__ == "__main__":
  app.run(main)
