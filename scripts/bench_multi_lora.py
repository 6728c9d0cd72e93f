r"""Multi-LoRA against separate runs: resident device bytes and seconds per step, measured.

  python scripts/bench_multi_lora.py                        # small, tenants 1 2 4, 3 steps
  python scripts/bench_multi_lora.py --model=tiny --tenants=1,2 --steps=2   # CPU smoke run

Runs `configs/multi_lora.py` through the loop (`methods.multi_lora.MultiLoRA`) with N tenants
(`t0 … t{N-1}`, seeds 0 … N−1, the same task), and, as the references measured in the same
process, one single-LoRA GRPO run and one full fine-tuning GRPO run of the same config. Prints
JSON lines:

  {"what": "multi_lora", "tenants": N, "resident_bytes": ..., "base_bytes": ...,
   "per_tenant_bytes": ..., "step_s": ..., "step_s_per_tenant": ..., "first_step_s": ...}
  {"what": "single_lora", ...}     # one GRPO run with config.lora (N of them: N × its bytes)
  {"what": "full", ...}            # one full fine-tuning GRPO run (rank 0)
  {"what": "ratio", "tenants": N, "vs_single_lora_runs": ..., "vs_full_runs": ...}

With `--compilation_cache_dir` (fresh, and `--references=false` so that no reference run fills
it first) the tenants' identical programs are compiled once and loaded from the cache after:
compare `first_step_s` with and without.

`resident_bytes` are what stays in device memory between steps: every train state (adapters
or parameters, optimizer moments) plus the frozen base, counted once however many tenants
read it. Temporaries of an update are not included (tenants update one after another, so
they are one tenant's: `scripts/aot_compile.py` measures them for a real preset). `step_s` is
the median wall time of the steps after the first (rollouts, scoring and updates of every
tenant); `first_step_s` includes the compiles. Rewards do not matter here, so the policy is
the preset's random initialisation.
"""

import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.methods.multi_lora import MultiLoRA
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
_MODEL = flags.DEFINE_string("model", "small", "model preset")
_TENANTS = flags.DEFINE_list("tenants", ["1", "2", "4"], "tenant counts to measure")
_STEPS = flags.DEFINE_integer("steps", 3, "steps per run (the first compiles)")
_RANK = flags.DEFINE_integer("rank", 16, "LoRA rank")
_REFERENCES = flags.DEFINE_bool("references", True, "also time a single-LoRA and a full run")
_CACHE = flags.DEFINE_string("compilation_cache_dir", "", "JAX's persistent cache, as the "
                             "binaries set it: tenants with equal programs then compile once")
_MIN_COMPILE_S = flags.DEFINE_float("min_compile_s", 1.0, "with the cache: programs compiled "
                                    "faster than this are not cached (JAX's default 1 s)")


def _config(tenants: int, rank: int):
  config = load_module(ROOT / "configs" / "multi_lora.py").get_config("runlocal")
  config.update(dict(model=_MODEL.value, steps=_STEPS.value, eval_at_start=False,
                     eval_every=0, checkpoint_every=_STEPS.value, log_every=1,
                     metric_writers="jsonl", prompts_per_step=4))
  config.lora.update(dict(rank=rank, alpha=2.0 * max(rank, 1)))
  config.multi_lora.tenants = {f"t{i}": {"seed": i} for i in range(tenants)}
  return config


def _bytes(tree) -> int:
  return int(sum(x.nbytes for x in jax.tree.leaves(tree)))


def _timed(config, method, what: str, **extra) -> dict:
  with tempfile.TemporaryDirectory() as workdir:
    tic = time.perf_counter()
    state = loop.train(config, workdir, method)
    wall = time.perf_counter() - tic
    steps = [r for r in read_metrics(workdir) if "train/nonfinite_streak" in r]
  run = method.run if hasattr(method, "run") else None
  frozen = getattr(run, "frozen", None)
  state_bytes, base_bytes = _bytes(state), _bytes(frozen) if frozen is not None else 0
  # Per-step wall time from the loop's own clock is not logged; the tenants' time/* keys are.
  per_step = [sum(v for k, v in r.items() if k.startswith("time/") or "/time/" in k)
              for r in steps]
  return dict(what=what, model=config.model, rank=int(config.lora.rank), **extra,
              resident_bytes=state_bytes + base_bytes, base_bytes=base_bytes,
              state_bytes=state_bytes, run_s=round(wall, 2),
              first_step_s=round(per_step[0], 3) if per_step else None,
              step_s=round(float(np.median(per_step[1:])), 3) if len(per_step) > 1 else None)


def main(argv):
  del argv
  if _CACHE.value:
    run_setup.enable_compilation_cache(_CACHE.value)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_S.value)
  if not _REFERENCES.value:
    for n in map(int, _TENANTS.value):
      config = _config(n, _RANK.value)
      print(json.dumps(_timed(config, MultiLoRA(config), "multi_lora", tenants=n,
                              cache=bool(_CACHE.value))), flush=True)
    return
  config = _config(1, _RANK.value)
  single_config = config.copy_and_resolve_references()
  del single_config["multi_lora"]
  single = _timed(single_config, GRPO(single_config), "single_lora")
  print(json.dumps(single), flush=True)
  full_config = single_config.copy_and_resolve_references()
  full_config.lora.rank = 0
  full = _timed(full_config, GRPO(full_config), "full")
  print(json.dumps(full), flush=True)
  for n in map(int, _TENANTS.value):
    config = _config(n, _RANK.value)
    line = _timed(config, MultiLoRA(config), "multi_lora", tenants=n)
    line["per_tenant_bytes"] = line["state_bytes"] // n
    line["step_s_per_tenant"] = (round(line["step_s"] / n, 3) if line["step_s"] is not None
                                 else None)
    print(json.dumps(line), flush=True)
    print(json.dumps(dict(
      what="ratio", tenants=n,
      vs_single_lora_runs=round(line["resident_bytes"] / (n * single["resident_bytes"]), 3),
      vs_full_runs=round(line["resident_bytes"] / (n * full["resident_bytes"]), 3),
      step_s_vs_single=(round(line["step_s"] / (n * single["step_s"]), 3)
                        if line["step_s"] and single["step_s"] else None))), flush=True)


if __name__ == "__main__":
  app.run(main)
