"""The recipe's whole path offline: Hub checkpoint and dataset → GRPO → evaluate → export →
`transformers`.

A reduced-depth random Qwen3 with a real BPE tokenizer and a Qwen3-style chat template
(`jaxrl_post.standin`) and GSM8K-shaped parquet files are staged in a Hub cache as
`Qwen/Qwen3-0.6B` and `openai/gsm8k`; with `HF_HUB_OFFLINE=1` the binaries then run the
config exactly as a user would (`init_from="hf:Qwen/Qwen3-0.6B"`, the Hub's dataset files),
only shrunk by `runlocal`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from jaxrl_post.models import default_positions
from jaxrl_post.standin import stage_in_hub_cache, write_gsm8k_standin, write_standin_checkpoint
from jaxrl_post.training.metrics import read_metrics
from jaxrl_post.training.run_dir import load_run

ROOT = Path(__file__).resolve().parents[2]


def _run(env, *args):
  result = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.fixture(scope="module")
def offline_hub(tmp_path_factory):
  root = tmp_path_factory.mktemp("recipe")
  cache = root / "hub"
  stage_in_hub_cache(write_standin_checkpoint(root / "qwen3"), "Qwen/Qwen3-0.6B",
                     cache_dir=cache)
  write_gsm8k_standin(root / "gsm8k", train=32, test=8)
  stage_in_hub_cache(root / "gsm8k", "openai/gsm8k", cache_dir=cache, repo_type="dataset")
  env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), XLA_FLAGS="",
             JAX_PLATFORMS="cpu")
  return root, env


def test_hub_to_grpo_to_evaluation_to_transformers(offline_hub, monkeypatch):
  root, env = offline_hub
  for key in ("HF_HUB_OFFLINE", "HF_HUB_CACHE"):  # load_run below reads the Hub cache too
    monkeypatch.setenv(key, env[key])
  workdir, exported = root / "run", root / "exported"
  _run(env, "experiments/grpo.py", "--config=configs/grpo_gsm8k.py:runlocal",
       f"--workdir={workdir}", "--config.init_from=hf:Qwen/Qwen3-0.6B",
       "--config.compilation_cache_dir=")
  config = json.loads((workdir / "config.json").read_text())
  assert config["init_from"] == "hf:Qwen/Qwen3-0.6B" and config["chat_template"]
  records = read_metrics(workdir)
  assert max(r["step"] for r in records) == 2
  # Rewards went through the verifier (a random stand-in earns none, so its update is zero:
  # the weights' equality with the export is what is checked below).
  assert [r["train/reward_failures"] for r in records if "train/reward_failures" in r] == [0, 0]
  in_run = [r for r in records if r["step"] == 2 and "eval/accuracy" in r][0]

  # The evaluation binary on the final checkpoint prints what the run logged at that step.
  report = root / "eval.json"
  _run(env, "experiments/evaluate.py", f"--run_dir={workdir}", f"--output={report}")
  offline = json.loads(report.read_text())
  assert offline["settings"]["chat_template"] is True
  for key in ("accuracy", "sample_accuracy", "pass_at_1", "pass_at_2"):
    assert offline["metrics"][key] == pytest.approx(in_run[f"eval/{key}"]), key

  _run(env, "scripts/export_hf.py", f"--run_dir={workdir}", f"--out={exported}")
  generation = json.loads((exported / "generation_config.json").read_text())
  tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
  assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation["eos_token_id"]
  prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                         tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
  assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")

  # transformers' logits of the exported weights equal ours of the trained checkpoint.
  tokens = np.asarray([tokenizer(prompt)["input_ids"]], np.int32)
  mask = np.ones_like(tokens, bool)
  run = load_run(workdir)
  ours = np.asarray(nnx.jit(lambda m, t, a: m(t, attention_mask=a))(
    run.model, jnp.asarray(tokens), jnp.asarray(mask)))
  reference = transformers.AutoModelForCausalLM.from_pretrained(exported,
                                                                torch_dtype=torch.float32)
  with torch.no_grad():
    theirs = reference(torch.as_tensor(tokens, dtype=torch.long),
                       position_ids=torch.as_tensor(np.asarray(default_positions(
                         jnp.asarray(mask))), dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
