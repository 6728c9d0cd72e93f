r"""The GSM8K recipe end to end on a local stand-in, with numbers: does the path learn, and does
the exported checkpoint decode exactly as ours?

  python scripts/recipe_standin.py --root=/tmp/recipe_standin --seed=0

Nothing is downloaded. A reduced random Qwen3 (`jaxrl_post.standin`, sizes below) with a BPE
tokenizer and a Qwen3-style chat template, and GSM8K-shaped word problems (two-number sums,
`standin.gsm8k_rows`), go through the commands a user runs on the real checkpoint:

  1. SFT on the worked solutions (configs/grpo_gsm8k.py:sft), chat-templated prompts;
  2. scripts/export_hf.py of the SFT run, which GRPO starts from (configs/grpo_gsm8k.py);
  3. experiments/evaluate.py on both exports (greedy, mean@n, pass@k on the test problems);
  4. the paired change in accuracy from SFT to GRPO over the same problems;
  5. parity: `transformers`' greedy `generate` on the GRPO export against our sampler's greedy
     completions of the same chat prompts, token for token.

Prints one JSON line with the numbers (docs/results.md, "The GSM8K recipe on a stand-in").
Settings differ from the real recipe where a random 0.7M-parameter model needs it (float32,
a higher learning rate, a smaller batch); each one is a `--config.*` override below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from absl import app, flags

ROOT = Path(__file__).resolve().parents[1]

_ROOT_DIR = flags.DEFINE_string("root", "/tmp/recipe_standin", "Where everything is written.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the stand-in's weights, data and runs.")
_SFT_STEPS = flags.DEFINE_integer("sft_steps", 1000, "SFT steps.")
_GRPO_STEPS = flags.DEFINE_integer("grpo_steps", 30, "GRPO steps.")
_TRAIN = flags.DEFINE_integer("train_rows", 2000, "Training problems.")
_TEST = flags.DEFINE_integer("test_rows", 200, "Test problems (all evaluated).")
_N = flags.DEFINE_integer("n", 8, "Samples per test problem for mean@n and pass@k.")
_PARITY = flags.DEFINE_integer("parity_prompts", 32, "Test prompts decoded by both libraries.")

PROMPT_LEN, NEW_TOKENS = 96, 48


def _run(*args) -> str:
  tic = time.perf_counter()
  result = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, XLA_FLAGS=""))
  if result.returncode:
    raise RuntimeError(f"{' '.join(map(str, args))} failed:\n{result.stderr[-4000:]}")
  print(f"{args[0]}: {time.perf_counter() - tic:.0f} s", flush=True)
  return result.stdout


def _evaluate(model_dir: Path, data: Path, out: Path) -> dict:
  _run("experiments/evaluate.py", f"--init_from={model_dir}", "--task=gsm8k",
       f"--task_knobs={json.dumps({'local_dir': str(data)})}", "--chat_template",
       f"--chat_template_kwargs={json.dumps({'enable_thinking': False})}",
       f"--num_examples={_TEST.value}", f"--n={_N.value}", f"--k=1,{_N.value}",
       f"--max_new_tokens={NEW_TOKENS}", f"--max_prompt_len={PROMPT_LEN}",
       f"--seed={_SEED.value}", f"--output={out}")
  return json.loads(out.read_text())


def _parity(model_dir: Path, data: Path) -> dict:
  """Greedy completions of our sampler and of `transformers.generate` on the same chat prompts."""
  import torch
  import transformers

  from jaxrl_post.models.hf import load_hf
  from jaxrl_post.sampling import Sampler
  from jaxrl_post.tasks.base import get_task
  from jaxrl_post.tasks.chat import ChatTask
  from jaxrl_post.tokenizers import get_tokenizer

  tokenizer = get_tokenizer(str(model_dir))
  task = ChatTask(get_task("gsm8k", local_dir=str(data)), tokenizer,
                  template_kwargs={"enable_thinking": False})
  prompts = [task.make_example("test", i)["prompt"] for i in range(_PARITY.value)]
  sampler = Sampler(load_hf(model_dir), tokenizer, max_prompt_len=PROMPT_LEN)
  ours = sampler.generate(None, prompts, max_new_tokens=NEW_TOKENS, greedy=True)
  reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                                dtype=torch.float32)
  generation = transformers.GenerationConfig.from_pretrained(model_dir)
  same = 0
  for i, prompt in enumerate(prompts):
    ids = torch.as_tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
      out = reference.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                               eos_token_id=generation.eos_token_id,
                               pad_token_id=generation.pad_token_id)
    theirs = out[0, ids.shape[1]:].tolist()
    mine = np.asarray(ours.completion_tokens[i])[np.asarray(ours.completion_mask[i])].tolist()
    same += int(mine == theirs)
  return {"prompts": len(prompts), "token_exact": same}


def main(argv):
  del argv
  from jaxrl_post.standin import write_gsm8k_standin, write_standin_checkpoint
  from jaxrl_post.training.evaluation import paired_gain

  root, seed = Path(_ROOT_DIR.value), _SEED.value
  standin = write_standin_checkpoint(root / "standin", embed_dim=128, num_layers=4, num_heads=4,
                                     num_kv_heads=2, head_dim=32, mlp_dim=384, seed=seed)
  data = root / "data"
  write_gsm8k_standin(data, train=_TRAIN.value, test=_TEST.value, seed=seed)
  common = [f"--config.seed={seed}", "--config.param_dtype=float32", "--config.dtype=float32",
            f"--config.prompt_len={PROMPT_LEN}", "--config.num_micro_batches=1",
            f"--config.eval_examples={min(64, _TEST.value)}", "--config.compilation_cache_dir="]
  _run("experiments/sft.py", f"--config=configs/grpo_gsm8k.py:sft,mesh=auto,data_dir={data}",
       f"--workdir={root / 'sft'}", f"--config.init_from={standin}", *common,
       f"--config.steps={_SFT_STEPS.value}", f"--config.completion_len={NEW_TOKENS}",
       "--config.batch_size=32", "--config.optimizer.lr=1e-3", "--config.eval_every=100",
       f"--config.checkpoint_every={_SFT_STEPS.value}",
       f"--config.eval_max_new_tokens={NEW_TOKENS}")
  _run("scripts/export_hf.py", f"--run_dir={root / 'sft'}", f"--out={root / 'sft_hf'}",
       "--overwrite")
  _run("experiments/grpo.py", f"--config=configs/grpo_gsm8k.py:mesh=auto,data_dir={data}",
       f"--workdir={root / 'grpo'}", f"--config.init_from={root / 'sft_hf'}", *common,
       f"--config.steps={_GRPO_STEPS.value}", f"--config.max_new_tokens={NEW_TOKENS}",
       "--config.trim_completions_to=16", "--config.prompts_per_step=16",
       "--config.ppo_mini_batches=1", "--config.score_micro_batches=1",
       "--config.optimizer.lr=5e-5", "--config.optimizer.warmup_steps=0",
       "--config.eval_every=10", "--config.eval_rows_per_call=0",
       f"--config.checkpoint_every={_GRPO_STEPS.value}")
  _run("scripts/export_hf.py", f"--run_dir={root / 'grpo'}", f"--out={root / 'grpo_hf'}",
       "--overwrite")
  before = _evaluate(root / "sft_hf", data, root / "eval_sft.json")
  after = _evaluate(root / "grpo_hf", data, root / "eval_grpo.json")
  gain = {}
  for key in ("greedy_correct", "sample_correct"):
    values = [np.asarray([p[key] for p in report["problems"]], np.float64)
              for report in (before, after)]
    mean, se = paired_gain(*values)
    gain[key] = [round(100 * mean, 2), round(100 * se, 2)]
  metrics = ("accuracy", "sample_accuracy", "pass_at_1", f"pass_at_{_N.value}")
  print(json.dumps({
    "seed": seed,
    "sft": {k: round(before["metrics"][k], 4) for k in metrics},
    "grpo": {k: round(after["metrics"][k], 4) for k in metrics},
    "paired_gain_points": gain,
    "parity": _parity(root / "grpo_hf", data),
  }), flush=True)


if __name__ == "__main__":
  app.run(main)
