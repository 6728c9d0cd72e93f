"""configs/grpo_gsm8k.py and configs/grpo_math.py: every model × mesh builds a valid config,
and `aot_compile.py --config` reads the sizes its binary would compile (`compile_sizes`)."""

from pathlib import Path

import pytest

from jaxrl_post.benchmarking import compile_sizes
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("qwen3_0p6b", "qwen3_1p7b", "qwen3_4b", "qwen3_8b")
MESHES = {"gpu8": (8, 1), "v5p8": (4, 1), "v5e16": (4, 4)}  # (fsdp, tensor)


def _config(name, arg):
  return load_module(ROOT / "configs" / f"{name}.py").get_config(arg)


@pytest.mark.parametrize("name", ["grpo_gsm8k", "grpo_math"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mesh", list(MESHES))
def test_every_model_and_mesh_divides(name, model, mesh):
  config = _config(name, f"model={model},mesh={mesh}")
  assert config.init_from == "hf:Qwen/Qwen3-" + {"qwen3_0p6b": "0.6B", "qwen3_1p7b": "1.7B",
                                                 "qwen3_4b": "4B", "qwen3_8b": "8B"}[model]
  assert config.tokenizer == "init_from" and config.chat_template
  assert (config.mesh.ici_fsdp, config.mesh.ici_tensor) == MESHES[mesh]
  rollouts = config.prompts_per_step * config.group_size
  rows = rollouts // config.ppo_mini_batches
  assert rollouts % config.ppo_mini_batches == 0
  # Each micro-batch gives every batch shard (fsdp) at least one row.
  assert rows % config.num_micro_batches == 0
  assert rows // config.num_micro_batches >= MESHES[mesh][0]


def test_aot_flags_from_config():
  flags = compile_sizes(_config("grpo_gsm8k", "model=qwen3_8b,mesh=gpu8"))
  assert flags["model"] == "qwen3_8b" and flags["num_cpu_devices"] == 8
  assert flags["batch"] == 128 and flags["sample_batch"] == 256
  assert flags["prompt_len"] == 256 and flags["completion_len"] == 1024
  assert flags["ici"] == "data=1,fsdp=8,tensor=1"
  assert flags["param_dtype"] == "bfloat16" and flags["moments_dtype"] == "float32"
  assert flags["optimizer"] == "adamw"


def test_data_dir_and_bad_args():
  config = _config("grpo_math", "runlocal,data_dir=/data/math")
  assert config.task_knobs.local_dir == "/data/math" and config.init_from == ""
  assert "eval_tasks" not in config
  with pytest.raises(ValueError, match="model='qwen3_70b'.*qwen3_0p6b"):
    _config("grpo_gsm8k", "model=qwen3_70b")
  with pytest.raises(ValueError, match="mesh='tpu'.*gpu8"):
    _config("grpo_gsm8k", "mesh=tpu")


def test_sft_variant_shares_model_data_and_prompts():
  sft, grpo = _config("grpo_gsm8k", "sft,model=qwen3_4b"), _config("grpo_gsm8k", "model=qwen3_4b")
  for key in ("task", "init_from", "tokenizer", "chat_template", "system_prompt", "prompt_len",
              "param_dtype", "num_micro_batches"):
    assert sft[key] == grpo[key], key
  assert sft.completion_len == grpo.max_new_tokens and "loss" not in sft
  assert sft.batch_size % sft.num_micro_batches == 0
