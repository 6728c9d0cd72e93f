r"""GRPO of Qwen3 on GSM8K, from the Hub's checkpoint to an exported one.

  python experiments/grpo.py --config=configs/grpo_gsm8k.py:model=qwen3_0p6b,mesh=gpu8 \
      --workdir=/tmp/grpo_gsm8k
  python experiments/evaluate.py --run_dir=/tmp/grpo_gsm8k --task=gsm8k --n=8 --k=1,4,8
  python scripts/export_hf.py --run_dir=/tmp/grpo_gsm8k --out=/tmp/grpo_gsm8k_hf

Config args: `model=qwen3_0p6b|qwen3_1p7b|qwen3_4b|qwen3_8b`, `mesh=gpu8|v5p8|v5e16|auto`,
`loss=<policy loss name>`, `data_dir=<a local copy of the dataset repository>`, `sft` (SFT on
the worked solutions instead: a warm start to export and start GRPO from), `runlocal` (see
configs/qwen3_recipe_common.py). The model, tokenizer and chat template come from
`hf:Qwen/Qwen3-<size>`, the data from the Hub's `openai/gsm8k` files (downloaded once into
the Hub cache), or from `data_dir` laid out as on the Hub.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg

common = load_module(Path(__file__).with_name("qwen3_recipe_common.py"))

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, model="qwen3_0p6b", mesh="gpu8", loss="grpo", data_dir="",
                  sft=False, runlocal=False)
  return common.recipe_config(arg, task="gsm8k", task_knobs={}, prompt_len=256,
                              max_new_tokens=1024)


sweep = common.sweep


def metrics():
  return ["train/reward_correct", "eval/accuracy", "eval/pass_at_4"]
