r"""ReflectRL (arXiv 2608.03972; jaxrl_post/methods/reflect_rl.py) on arithmetic.

Of each prompt's N = 8 rollouts, K_t = round(N g(t)) are sampled from the reflective prompt
(the problem, a golden negative trajectory o⁻ and "find the error, then answer") and the rest
from the direct one; g(t) falls from p_h to p_l over the transition (cosine, Eq. 7), after which
training is plain GRPO. One group per prompt: the advantage is normalised over the mixed group.
The golden negatives are the task's own: the worked solution with its first carry or borrow
dropped (`ArithmeticTask.golden_negative`; problems without one are direct only, about two in
three here), or a JSONL file `{"prompt": ..., "negative": ...}` per line
(`--config.reflect.negatives_path=...`).

Commands (R = a directory with the SFT policy of configs/sft_arith.py):

  python experiments/reflect_rl.py --config=configs/reflect_rl.py \
      --workdir=/tmp/reflect_rl/reflect --config.init_from=$R/sft
  python experiments/reflect_rl.py --config=configs/reflect_rl.py \
      --workdir=/tmp/reflect_rl/grpo --config.init_from=$R/sft --config.reflect.p_high=0
  python experiments/reflect_rl.py --config=configs/reflect_rl.py:runlocal \
      --workdir=/tmp/reflect_rl_smoke
  python experiments/reflect_rl.py --config=configs/reflect_rl.py:mode=opd,teacher=$R/grpo \
      --workdir=/tmp/reflect_rl/opd --config.init_from=$R/sft

The second is the GRPO baseline (K_t = 0 at every step: the same generate call as
experiments/grpo.py); the fourth the OPD variant (Eq. 11), with a GRPO policy of
configs/grpo_arith.py as the teacher. Expected: `reflect/count` 4 → 0 over the first 60 % of
the steps; with a policy that makes carry slips, `reflect/reward_reflective` above
`reflect/reward_direct` (Δ_ref > 0, `reflect/delta_ref`) early on. Runtime: not yet measured;
about configs/grpo_arith.py's (≈ 10 min on 2 CPU cores) plus the longer prefill of the
reflective rows. A runlocal run takes ≈ 15 s with a warm compilation cache, ≈ 36 s cold, on
2 loaded cores.

Variants (after the colon): `runlocal` (tiny model, 3 steps), `kernel=cosine|linear|step`
(`losses.REFLECT_KERNELS`), `steps=<n>`, `model=<preset>`, `p_high=<g at the start>`,
`mode=rlvr|opd`, `teacher=<checkpoint dir>` (mode=opd).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs


def reflect_config(arg) -> ml_collections.ConfigDict:
  r = ml_collections.ConfigDict()
  # "rlvr": mixed reflective / direct prompt groups (Eq. 9); "opd": the student samples x^D
  # and a frozen teacher (a checkpoint directory) scores under x^R for K^batch rows (Eq. 11).
  r.mode = arg.mode
  r.teacher = arg.teacher
  r.kernel = arg.kernel
  # PROPOSAL (the paper gives none): p_h = 0.5, p_l = 0, no warm-up, the transition
  # over the first 60 % of the steps (None here), direct only afterwards.
  r.p_high = arg.p_high
  r.p_low = 0.0
  r.warmup_steps = 0
  r.transition_steps = ml_collections.config_dict.placeholder(int)
  # x^R(q, o⁻). The task's prompt ends with a newline, so the template adds none before the
  # negative; short because the tokenizer is per character (45 tokens of overhead).
  r.template = "{prompt}A wrong solution:\n{negative}\nFind the error, then answer:\n"
  # '' = the task's own golden negatives; else a JSONL file keyed by prompt text.
  r.negatives_path = ""
  # The task's negatives: drop the "first" carry, or a "random" one (seeded per problem).
  r.slip = "first"
  # o⁻ longer than this is cut to its first `negative_head` tokens and its end (PROPOSAL:
  # first 256 of 2048 in the paper's setting; here 16 of 96, more than the
  # longest arithmetic negative (67), so only a JSONL source is ever cut).
  r.negative_tokens = 96
  r.negative_head = 16
  return r


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=30, kernel="cosine", p_high=0.5,
                  mode="rlvr", teacher="")
  config = base_configs.grpo_base("grpo")
  # The task of configs/grpo_arith.py and configs/sft_arith.py (its SFT policy is the start).
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                          demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  # The paper's setting in miniature: N = 8, 16 prompts (128 rollouts per step), two updates of 64
  # (the paper's update batch), T = 1, the GRPO advantage, no KL term (β = 0). The paper's
  # entropy bonus (0.001) has no counterpart in `losses.POLICY_LOSSES`; lr as GRPO on this
  # task (the paper's 1e-6 is for 1.5-7B models).
  config.group_size = 8
  config.prompts_per_step = 16
  config.ppo_mini_batches = 2
  config.temperature = 1.0
  config.advantage = "grpo"
  config.loss.beta = 0.0
  # Reflective prompts: ≤ 125 tokens over every 1-2 digit problem (direct ones ≤ 10).
  config.prompt_len = 128
  config.reflect = reflect_config(arg)
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.steps = 3 if arg.steps == 30 else arg.steps
    # 4 prompts × 4 rollouts: some prompts have a golden negative, some groups a reward.
    config.prompts_per_step = 4
    # A fixed transition (not 60 % of `steps`), so a run of 2 steps continued to 3 follows
    # the 3-step run's schedule: K = 2, 1, 1 at steps 1, 2, 3. Every step has reflective rows
    # (prompt bucket 128), so the test compiles one set of shapes; the direct-only path
    # (K = 0) is GRPO's call, run by `--config.reflect.p_high=0` or `steps=5`.
    config.reflect.transition_steps = 5
    config.eval_every = 0  # step 0 and the last step
    config.eval_examples = 2
    config.eval_pass_k = 0
    config.checkpoint_every = 1
  return config


def sweep(add, arg=None):
  """GRPO (`reflect.p_high=0`: K_t = 0 throughout) against ReflectRL, seeds 0 1 2.

    python scripts/sweep.py --config=configs/reflect_rl.py --workdir=/tmp/sweeps/reflect_rl \
        -- --config.init_from=/tmp/sft_arith
  """
  del arg
  for seed in (0, 1, 2):
    for p_high in (0.0, 0.5):
      add(**{"reflect.p_high": p_high, "seed": seed})


def metrics():
  return ["eval/accuracy", "train/reward_correct", "reflect/count", "reflect/reward_reflective",
          "reflect/reward_direct", "reflect/delta_ref"]
