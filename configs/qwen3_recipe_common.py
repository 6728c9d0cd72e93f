"""What configs/grpo_gsm8k.py and configs/grpo_math.py share: Qwen3 from the Hub, meshes, sizes.

The config argument picks the model and the hardware:

  model=qwen3_0p6b | qwen3_1p7b | qwen3_4b | qwen3_8b   (starts from hf:Qwen/Qwen3-<size>)
  mesh=gpu8   one node of 8 GPUs (80 GB H100 class):   fsdp=8
       v5p8   a TPU v5p-8 slice (4 chips, 95 GB each): fsdp=4
       v5e16  a TPU v5e-16 slice (16 chips, 16 GB each): fsdp=4 × tensor=4
       auto   every visible device on fsdp (what a laptop or one GPU gets)

Rows per update, micro-batches and the sampler's batch come from `SIZES`; the bytes per device
that `scripts/aot_compile.py --config=configs/grpo_gsm8k.py:model=...,mesh=...` predicts for
each pair are in docs/benchmarks.md ("The GSM8K / MATH recipe"). Every run option can be
overridden on the command line (`--config.num_micro_batches=8`).

`data_dir=DIR` reads the dataset from a local copy of its Hub repository (same layout;
`hf download --repo-type dataset openai/gsm8k --local-dir DIR`) instead of the Hub.

`runlocal` runs the same path on a local stand-in (`jaxrl_post.standin`): pass its directory
as `--config.init_from` and the dataset's as `data_dir`.
"""

from jaxrl_post.parallel.mesh import mesh_config
from jaxrl_post.training import base_configs

HUB_REPOS = {
  "qwen3_0p6b": "Qwen/Qwen3-0.6B",
  "qwen3_1p7b": "Qwen/Qwen3-1.7B",
  "qwen3_4b": "Qwen/Qwen3-4B",
  "qwen3_8b": "Qwen/Qwen3-8B",
}

# mesh name → (trainer / sampler mesh sizes, the sampler's rule table). The sampler shares the
# trainer's devices. On 80–95 GB devices the mesh is all FSDP and the sampler's "tensor" rules
# (no tensor axis there) give each device a whole copy of the weights to decode with: fast, and
# it fits up to 8B. 16 GB v5e chips cannot hold that copy: 4-way tensor parallelism shards
# the weights and the KV cache's heads for both roles (the update's rules shard over fsdp and
# tensor), 4-way FSDP the rest.
MESHES = {"gpu8": ({"fsdp": 8}, "tensor"), "v5p8": ({"fsdp": 4}, "tensor"),
          "v5e16": ({"fsdp": 4, "tensor": 4}, "tensor"), "auto": ({"fsdp": -1}, "tensor")}

# Gradient-accumulation steps per model and mesh: one micro-batch holds 1–4 rows per batch
# shard (checked with aot_compile.py; docs/benchmarks.md).
MICRO_BATCHES = {
  "qwen3_0p6b": {"gpu8": 2, "v5p8": 2, "v5e16": 4, "auto": 8},
  "qwen3_1p7b": {"gpu8": 4, "v5p8": 4, "v5e16": 8, "auto": 16},
  "qwen3_4b": {"gpu8": 8, "v5p8": 8, "v5e16": 16, "auto": 32},
  "qwen3_8b": {"gpu8": 16, "v5p8": 16, "v5e16": 32, "auto": 64},
}


def recipe_config(arg, *, task: str, task_knobs: dict, prompt_len: int,
                  max_new_tokens: int, eval_tasks: dict | None = None):
  """GRPO (or, with `arg.sft`, SFT) on a maths task from a Qwen3 checkpoint; `arg` holds model,
  mesh, loss, data_dir, sft, runlocal.

  GRPO settings follow common open GRPO recipes for Qwen3 on maths (DAPO-style clipping
  0.2 / 0.28, β = 0, token-mean loss, learning rate 1e-6 with AdamW, 8 samples per prompt,
  temperature 1), in bf16 compute with float32 Adam moments. Thinking is off
  (`enable_thinking=False`): the completion budget is the reasoning budget.

  `sft` fine-tunes on the dataset's worked solutions instead (a warm start for a base model,
  or for the stand-in): export its run with scripts/export_hf.py and start GRPO from that
  directory (`--config.init_from=<export>`), which carries the tokenizer and template too.
  """
  if arg.model not in HUB_REPOS:
    raise ValueError(f"config arg model={arg.model!r}; valid: {', '.join(HUB_REPOS)}")
  if arg.mesh not in MESHES:
    raise ValueError(f"config arg mesh={arg.mesh!r}; valid: {', '.join(MESHES)}")
  micro = MICRO_BATCHES[arg.model][arg.mesh]
  if arg.sft:
    config = base_configs.sft_base()
    config.completion_len = max_new_tokens
    config.batch_size = 64
    config.num_micro_batches = micro
    config.steps = 500
    config.optimizer = base_configs.optimizer_config(lr=1e-5, warmup_steps=20,
                                                     weight_decay=0.0, grad_clip=1.0)
    config.eval_every = 100
    config.eval_max_new_tokens = max_new_tokens
    config.checkpoint_every = 100
  else:
    config = base_configs.grpo_base(arg.loss)
    config.optimizer = base_configs.optimizer_config(lr=1e-6, warmup_steps=10,
                                                     weight_decay=0.0, grad_clip=1.0)
    config.long_prompts = "drop"  # the few problems longer than prompt_len (logged at start)
    config.max_new_tokens = max_new_tokens
    config.trim_completions_to = 128
    config.prompts_per_step = 32
    config.group_size = 8
    config.ppo_mini_batches = 2  # 128 rows per update
    config.num_micro_batches = micro
    config.score_micro_batches = micro
    config.reward_weights = dict(correct=1.0, format=0.0)
    config.reward_timeout_s = 5.0
    config.steps = 200
    config.eval_every = 25
    config.eval_pass_ks = (1, 4)
    config.eval_rows_per_call = 256  # the rollout batch's size: its KV cache is known to fit
    config.checkpoint_every = 25
    if eval_tasks:
      config.eval_tasks = eval_tasks
  config.task = task
  config.task_knobs = dict(task_knobs)
  if arg.data_dir:
    config.task_knobs.local_dir = arg.data_dir
  config.model = arg.model  # the preset of the same shape (aot_compile.py, tests)
  config.init_from = f"hf:{HUB_REPOS[arg.model]}"
  config.tokenizer = "init_from"  # the checkpoint's own tokenizer and chat template
  config.chat_template = True
  config.system_prompt = ""
  config.chat_template_kwargs = dict(enable_thinking=False)
  config.param_dtype = "bfloat16"
  config.dtype = "bfloat16"
  config.prompt_len = prompt_len
  config.eval_examples = 256
  config.eval_pass_k = 4
  config.keep_checkpoints = 3
  config.num_train_examples = 0  # every row of the train split
  ici, sample_rules = MESHES[arg.mesh]
  config.mesh = mesh_config(ici=ici, sample_rules=sample_rules)
  if arg.runlocal:
    shrink_for_runlocal(config)
  return config


def sweep(add, arg=None):
  """Three policy losses × three learning rates around the recipe's 1e-6."""
  del arg
  for loss in ("grpo", "gspo", "cispo"):
    for lr in (5e-7, 1e-6, 2e-6):
      add(**{"loss.name": loss, "optimizer.lr": lr})


def shrink_for_runlocal(config) -> None:
  """A few steps of the stand-in checkpoint in float32: the recipe's path, at test size."""
  config.init_from = ""  # the test passes the stand-in's directory
  config.param_dtype = config.dtype = "float32"
  config.mesh = mesh_config()
  config.prompt_len = 96
  config.num_micro_batches = 2
  config.steps = 2
  config.eval_every = 2
  config.eval_examples = 2
  config.eval_pass_k = 2
  config.checkpoint_every = 2
  config.optimizer.warmup_steps = 0
  config.optimizer.lr = 1e-4
  config.optimizer.decay_steps = 4
  if "completion_len" in config:  # SFT
    config.completion_len = 48
    config.batch_size = 4
    config.eval_max_new_tokens = 16
    return
  config.max_new_tokens = 16
  config.trim_completions_to = 16
  config.prompts_per_step = 2
  config.group_size = 4
  config.ppo_mini_batches = 1
  config.score_micro_batches = 1
  config.eval_pass_ks = (1, 2)
  config.eval_rows_per_call = 4  # exercises the chunked evaluation
  if config.get("eval_tasks"):
    del config["eval_tasks"]
