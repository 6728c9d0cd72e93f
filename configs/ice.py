r"""ICE: instruction-conditioned exploration with self-distillation to the unconditioned policy
(arXiv 2608.02087; jaxrl_post/methods/ice.py) on arithmetic, and its DAPO baseline.

Each group of `group_size` = 8 rollouts spreads over {no instruction, I_1..I_5} (the hints in
`ARITH_INSTRUCTIONS`, one line before the question); DAPO (token-mean, ε 0.2 / 0.28) trains on
the conditioned rollouts, and the bare-prompt policy is pulled toward the conditioned one on the
correct rollouts: β_S · KL(sg[π_old(·|x, I, y_<t)] ‖ π_θ(·|x, y_<t)), over the whole (char)
vocabulary. Evaluation is on bare prompts (the deployed student), plus greedy accuracy with each
instruction.

Commands (R = a directory with an SFT student, configs/sft_arith.py):

  python experiments/ice.py --config=configs/ice.py --workdir=/tmp/ice/ice \
      --config.init_from=$R/sft
  python experiments/ice.py --config=configs/ice.py:beta=0 --workdir=/tmp/ice/dapo \
      --config.init_from=$R/sft --config.ice.num_instructions=0        # the DAPO baseline
  python experiments/ice.py --config=configs/ice.py:kl=nll --workdir=/tmp/ice/nll \
      --config.init_from=$R/sft                                         # NLL surrogate
  python experiments/ice.py --config=configs/ice.py:runlocal --workdir=/tmp/ice_smoke

Variants (after the colon): `runlocal` (tiny model, 3 steps, for tests), `kl=forward|nll`,
`beta=<β_S>`, `steps=<n>`, `model=<preset>`. `sweep` declares the comparison: the DAPO baseline
(β_S = 0, no instructions) and ICE filtered, seeds 0 1 2.

Expected: not measured yet (no numbers in docs/results.md). The paper's pre-flight check
applies: instructions help only if they raise the starting policy's accuracy
(`eval/accuracy_with_instructions` vs `eval/accuracy` at step 0); a char-level SFT student has
never seen an instruction line, so check that first. A `small` run of 30 steps (16 prompts × 8)
takes minutes on a CPU host; `runlocal` ≈ 15-30 s on 2 loaded cores (mostly compilation).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.losses import ICE_BETA
from jaxrl_post.training import base_configs

# PROPOSAL (the paper's five instructions are not published): short nudges for the arithmetic
# task's column-by-column format, each ≤ 40 characters of the char tokenizer's alphabet.
ARITH_INSTRUCTIONS = (
  "Hint: work column by column.",
  "Hint: write every carry and borrow.",
  "Hint: if a-b<0, write -(b-a) first.",
  "Hint: recheck each column once.",
  "Hint: end with one line: #### answer",
)


def ice_config(arg) -> ml_collections.ConfigDict:
  ice = ml_collections.ConfigDict()
  ice.instructions = ARITH_INSTRUCTIONS
  # The first n instructions are used (-1: all; 0: none, the DAPO baseline with beta=0).
  ice.num_instructions = -1
  # β_S: PROPOSAL 0.1 (the paper gives no value); 0 turns the distillation off.
  ice.beta = arg.beta
  # "forward": token-level forward KL over the teacher's support; "nll": the sampled-token
  # surrogate (NLL of the correct conditioned tokens under the bare prompt).
  ice.kl = arg.kl
  # Teacher support: 0 = the whole vocabulary (char tokenizer); K for real vocabularies
  # (the teacher's top-K, both sides renormalised over them). PROPOSAL 64 for Qwen-size.
  ice.top_k = 0
  # The filter: rows whose `filter_reward` ≥ `correct_reward` are distilled (paper: R = 1).
  ice.filter_reward = "correct"
  ice.correct_reward = 1.0
  # Also evaluate greedy accuracy with each instruction (one greedy pass per instruction).
  ice.eval_with_instructions = True
  return ice


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=30, kl="forward", beta=ICE_BETA)
  config = base_configs.grpo_base("grpo")  # DAPO: token-mean, ε_low 0.2, ε_high 0.28, no KL
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                           demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  # The longest hint (36) + newline + the longest question ("Q: 99-99=\n", 10) in one bucket.
  config.prompt_len = 64
  # PROPOSAL G = 8: every one of the 6 contexts at least once per group.
  config.group_size = 8
  # PROPOSAL (the paper: lr 1e-6 for Qwen3): the project's arithmetic GRPO rate.
  config.optimizer.lr = 5e-5
  config.ice = ice_config(arg)
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.steps = 3 if arg.steps == 30 else arg.steps
    config.prompts_per_step = 2
    config.group_size = 4
    config.ice.num_instructions = 3  # 4 contexts: each row of a group a different one
    config.eval_every = 1
    config.checkpoint_every = 1
    config.eval_examples = 2
    config.eval_pass_k = 0
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    add(**{"ice.beta": 0.0, "ice.num_instructions": 0, "seed": seed})  # DAPO baseline
    add(**{"seed": seed})  # ICE filtered (β_S = 0.1, 5 instructions)


def metrics():
  return ["eval/accuracy", "eval/accuracy_with_instructions", "train/reward_correct",
          "ice/kl", "ice/correct_frac", "ice/reward_with_instruction",
          "ice/reward_without_instruction"]
