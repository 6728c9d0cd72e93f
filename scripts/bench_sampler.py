r"""Sampler throughput: jaxrl_post vs Hugging Face `transformers.generate`, same run.

  python scripts/bench_sampler.py                 # CPU: `small`, batch 64, prompt 64, 128 new
  python scripts/bench_sampler.py --cpu_devices=0 # CPU, one XLA device with its thread pool
  python scripts/bench_sampler.py --skip_transformers --model=qwen3_0p6b   # on a GPU
  python scripts/bench_sampler.py --workload=long_tail   # continuous vs static batching

One JSON line per measurement:
  {"what": "sampler", "engine": "jaxrl_post" | "transformers", "case": "n1" | "n8", ...,
   "prefill_tokens_per_s", "ttft_s", "decode_tokens_per_s", "total_s",
   "first_call_s" (ours: the warm-up round's prefill + decode, compilation included, with
   no persistent cache unless JAX_COMPILATION_CACHE_DIR is set), "first_generate_s"}
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

`--workload=long_tail` compares `Sampler.generate_continuous` with static
batches of `Sampler.generate` at the same cache memory (`--long_tail_slots`
rows × (prompt + cap) slots for both), on `--long_tail_rows` distinct
prompts, one sample each, on the same devices as above (with one device per
core, a static batch's rows and the continuous slots and queue are split
over them), alternating rounds as above:
  {"what": "sampler_long_tail", "engine": "static" | "continuous", "tokens", "total_s",
   "tokens_per_s", "mean_length", "max_length", "steps", "first_call_s" (the warm-up
   round, compilation included), ...}
  {"what": "sampler_long_tail_ratio", "speedup": continuous / static tokens per s, ...}
Lengths are long-tailed by construction (`StopHazardLM`): after each token,
EOS comes with probability 1/`--mean_length`, so lengths are geometric with
that mean, capped at `--long_tail_cap` new tokens. "Useful" tokens are the
generated ones up to each row's end (EOS included), the rollout's lengths.
"""

import json
import os
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

_MODEL = flags.DEFINE_string("model", "small", "Model preset.")
_BATCH = flags.DEFINE_integer("batch", 64, "Rows generated together.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 128, "Generated tokens per row.")
_GROUP = flags.DEFINE_integer("group", 8, "Samples per prompt in the second case.")
_REPEATS = flags.DEFINE_integer(
  "repeats", 3, "Timed rounds per engine (median), after a warm-up round; engines alternate.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter / compute dtype.")
_SKIP_HF = flags.DEFINE_bool("skip_transformers", False, "Only time jaxrl_post.")
_WORKLOAD = flags.DEFINE_enum(
  "workload", "fixed", ["fixed", "long_tail"],
  "fixed: every row generates max_new_tokens (ours vs transformers); long_tail: geometric "
  "lengths, continuous vs static batching.")
_LT_ROWS = flags.DEFINE_integer("long_tail_rows", 256, "long_tail: rows (distinct prompts).")
_LT_SLOTS = flags.DEFINE_integer(
  "long_tail_slots", 16, "long_tail: static batch size = continuous slots (same cache memory).")
_LT_MEAN = flags.DEFINE_integer("mean_length", 128, "long_tail: mean completion length.")
_LT_CAP = flags.DEFINE_integer("long_tail_cap", 1024, "long_tail: max_new_tokens.")
_LT_ADMIT = flags.DEFINE_integer(
  "admit_size", 0, "long_tail: rows admitted per prefill (0: the sampler's default).")
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
  batch = sampler.prepare(prompts.tolist())
  t = _NEW_TOKENS.value

  def prefill():
    return jax.block_until_ready(sampler.prefill(state, batch, max_new_tokens=t,
                                                 n_samples_per_prompt=n))

  def decode(start):
    return jax.block_until_ready(sampler.decode(state, start, rng=jax.random.key(0)))

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


class StopHazardLM(CausalLM):
  """A `CausalLM` that ends each row after a geometric number of tokens (mean `1 / hazard`).

  After input token x at position t, the next token is EOS if
  `hash(x, t) mod mean_length == 0` and never EOS otherwise (its logit is
  set to ±1e4). With tokens drawn across the vocabulary (random weights,
  temperature 1) each step ends the row with probability ≈ 1 / mean_length,
  independently of the row's past: lengths are geometric. The rule is a
  function of the sequence, like a trained model's stopping, so static and
  continuous batching see the same lengths for the same draws and the
  sampler needs no special path.
  """

  def __init__(self, config, *, rngs, mean_length: int, eos_id: int):
    super().__init__(config, rngs=rngs)
    self.mean_length, self.eos_id = mean_length, eos_id

  def __call__(self, tokens, *, positions=None, attention_mask=None, **kwargs):
    out = super().__call__(tokens, positions=positions, attention_mask=attention_mask, **kwargs)
    logits = out[0] if isinstance(out, tuple) else out
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    h = (tokens.astype(jnp.uint32) * np.uint32(0x9E3779B1)) ^ (
      positions.astype(jnp.uint32) * np.uint32(0x85EBCA77))
    h = (h ^ (h >> 15)) * np.uint32(0x2C1B3C6D)
    h = h ^ (h >> 12)
    stop = (h % np.uint32(self.mean_length)) == 0
    logits = logits.at[..., self.eos_id].set(jnp.where(stop, 1e4, -1e4))
    return (logits,) + tuple(out[1:]) if isinstance(out, tuple) else logits


def _long_tail(config, mesh, common: dict) -> None:
  """Continuous vs static batching on geometric lengths, same cache memory, alternating rounds.

  With a (data) mesh both split their rows over the devices: a static batch's
  rows, and the continuous slots and queue (one queue per device).
  """
  eos = 1
  model = StopHazardLM(config, rngs=nnx.Rngs(0), mean_length=_LT_MEAN.value, eos_id=eos)
  state = nnx.state(model)
  if mesh is not None:
    state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
  rows, slots, cap = _LT_ROWS.value, _LT_SLOTS.value, _LT_CAP.value
  sampler = Sampler(model, max_prompt_len=_PROMPT_LEN.value, eos_ids=[eos], pad_id=0, mesh=mesh,
                    rules=REPLICATED_RULES)
  prompts = np.random.RandomState(0).randint(3, config.vocab_size,
                                             (rows, _PROMPT_LEN.value)).tolist()
  admit = _LT_ADMIT.value or None

  def static_round():
    lengths = []
    for first in range(0, rows, slots):
      rollout = sampler.generate(state, prompts[first:first + slots], max_new_tokens=cap,
                                 rng=jax.random.key(first))
      # One batch at a time, as a trainer uses them. (Queueing all the batches'
      # programs on two CPU devices at once aborted 5 of 12 runs: an all-reduce
      # of the decode's per-device loops waited > 40 s for one device.)
      lengths.append(np.asarray(rollout.lengths))
    lengths = np.concatenate(lengths)
    # Each batch's loop runs until its longest row ends.
    steps = sum(int(lengths[i:i + slots].max()) for i in range(0, rows, slots))
    return dict(lengths=lengths, steps=steps)

  def continuous_round():
    rollout, stats = sampler.generate_continuous(state, prompts, num_slots=slots,
                                                 admit_size=admit, max_new_tokens=cap,
                                                 rng=jax.random.key(0), return_stats=True)
    return dict(lengths=np.asarray(rollout.lengths), steps=stats["steps"],
                passes=stats["passes"])

  def timed(fn):
    def one_round():
      seconds, out = _timed(fn)
      lengths = out.pop("lengths")
      return dict(total_s=seconds, tokens=int(lengths.sum()), mean_length=float(lengths.mean()),
                  max_length=int(lengths.max()), **out)
    return one_round

  runs, warm_up = {}, {}
  timings = _interleaved({"static": timed(static_round),
                          "continuous": timed(continuous_round)}, runs, warm_up)
  load = os.getloadavg()
  shared = dict(common, rows=rows, slots=slots, cache_slots_per_row=_PROMPT_LEN.value + cap,
                mean_length_target=_LT_MEAN.value, cap=cap, admit_size=admit,
                load_avg_1m=load[0], load_avg_5m=load[1])
  rates = {}
  for engine, t in timings.items():
    rates[engine] = t["tokens"] / t["total_s"]
    print(json.dumps(dict(what="sampler_long_tail", engine=engine, **shared, **t,
                          tokens_per_s=rates[engine],
                          first_call_s=warm_up[engine]["total_s"])),
          flush=True)
  # Rounds i of the two engines ran back to back: their ratio sees the same host.
  per_round = [(c["tokens"] / c["total_s"]) / (s["tokens"] / s["total_s"])
               for s, c in zip(runs["static"], runs["continuous"])]
  print(json.dumps(dict(what="sampler_long_tail_ratio", **shared,
                        speedup=rates["continuous"] / rates["static"],
                        speedup_per_round=per_round)), flush=True)


def _interleaved(rounds: dict[str, Callable[[], dict]], every_round: dict | None = None,
                 warm_up: dict | None = None) -> dict[str, dict[str, float]]:
  """Per engine, the median of every timing (`*_s`) over `--repeats` rounds after a warm-up.

  The engines alternate round by round, so that a drift of the host's speed (±20 % within
  minutes on a shared VM) falls on both and cancels in their ratio. `every_round`, if
  given, receives each engine's list of rounds; `warm_up` each engine's warm-up round (its
  programs' first calls, compilation included).
  """
  first = {name: one_round() for name, one_round in rounds.items()}
  if warm_up is not None:
    warm_up.update(first)
  results = {name: [] for name in rounds}
  for _ in range(_REPEATS.value):
    for name, one_round in rounds.items():
      results[name].append(one_round())
  if every_round is not None:
    every_round.update(results)
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
  if _WORKLOAD.value == "long_tail":
    _long_tail(config, mesh, dict(model=_MODEL.value, dtype=_DTYPE.value,
                                  prompt_len=_PROMPT_LEN.value, backend=jax.default_backend(),
                                  devices=jax.device_count()))
    return
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
    warm_up = {}
    timings = _interleaved(rounds, warm_up=warm_up)
    rows = prompts_count * n
    # We prefill each prompt once; transformers prefills its n expanded copies.
    first = warm_up["jaxrl_post"]
    ours = dict(_rates(timings["jaxrl_post"], prompts.size, rows),
                first_call_s=first["ttft_s"] + first["decode_s"],
                first_generate_s=first["total_s"])
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
