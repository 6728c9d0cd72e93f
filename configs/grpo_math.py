r"""GRPO of Qwen3 on MATH (the 7,500 training problems), evaluated on MATH-500.

  python experiments/grpo.py --config=configs/grpo_math.py:model=qwen3_1p7b,mesh=gpu8 \
      --workdir=/tmp/grpo_math
  python experiments/evaluate.py --run_dir=/tmp/grpo_math --task=math500 --n=16 --k=1,8,16

Config args as configs/grpo_gsm8k.py. Answers are the last `\boxed{...}` of the completion,
compared with the gold answer for mathematical equivalence by `math-verify` in a worker pool
(`config.reward_timeout_s` per sample; a time-out counts as wrong). The in-run evaluation
uses the first `eval_examples` problems of MATH's test split and, greedily, MATH-500.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg

common = load_module(Path(__file__).with_name("qwen3_recipe_common.py"))

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, model="qwen3_0p6b", mesh="gpu8", loss="grpo", data_dir="",
                  sft=False, runlocal=False)
  return common.recipe_config(arg, task="math", task_knobs={}, prompt_len=512,
                              max_new_tokens=2048,
                              eval_tasks={"math500": {"task": "math500", "task_knobs": {}}})


sweep = common.sweep


def metrics():
  return ["train/reward_correct", "eval/accuracy", "eval/math500/accuracy"]
