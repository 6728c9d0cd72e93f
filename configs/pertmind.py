r"""PertMind (arXiv 2608.16419): path-supervised GRPO with legal-token decoding on a synthetic
perturbation atlas (`tasks.perturbation_atlas`; PROPOSAL).

A query (cell line, drug, gene) + knowledge tokens (the drug's signed targets, the gene's
candidate pathways); the policy writes `1:L 2:L 3:L ans:L` (three pathway directions, then the
gene's label, L ∈ Up/Down/No) under a token grammar (`config.constrained_decoding`), so every
completion parses and every log-prob is the masked, renormalised one. Reward
`R = R_gene + λ_pw·m_pw·R_pw + λ_fmt·R_fmt` with the PROPOSAL per-query weight `w_conf`
(`rewards.pertmind`), group z-score advantages, the clipped surrogate and a sampled-token k3
KL to the frozen starting (SFT) policy. Held-out cell lines are the test split.

Commands:

  python experiments/sft.py --config=configs/pertmind.py:sft --workdir=/tmp/pertmind_sft
  python experiments/grpo.py --config=configs/pertmind.py --workdir=/tmp/pertmind_grpo \
      --config.init_from=/tmp/pertmind_sft
  # the paper's ablation: reward=gene (λ_pw = 0) | pathway (default) | shuffled (permuted
  # pathway proxy labels); scripts/pertmind_ablation.py runs all three over 3 seeds.
  python experiments/grpo.py --config=configs/pertmind.py:reward=gene ...

`runlocal` shrinks either stage to a few steps of the `tiny` model (the tests).
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs

REWARDS = ("gene", "pathway", "shuffled")
PROMPT_LEN = 48  # prompts are ≤ 44 characters
COMPLETION_LEN = 32  # "1:Down 2:Down 3:Down ans:Down" + EOS = 30 tokens
# The RL stage's binary (scripts/sweep.py); the `:sft` stage runs with experiments/sft.py.
BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, sft=False, model="tiny", loss="grpo", reward="pathway",
                  seed=0)
  if arg.reward not in REWARDS:
    raise ValueError(f"config arg reward={arg.reward!r}; valid: {', '.join(REWARDS)}")
  knobs = dict(seed=0, pathway_labels="shuffled" if arg.reward == "shuffled" else "true")
  config = base_configs.task_config(arg, task="pertmind", task_knobs=knobs,
                                    prompt_len=PROMPT_LEN, completion_len=COMPLETION_LEN)
  config.seed = arg.seed
  config.num_train_examples = 0  # the whole (label-balanced) train split
  if arg.sft:
    base_configs.sft_stage(config, completion_len=COMPLETION_LEN, runlocal=arg.runlocal)
    return config
  config.constrained_decoding = True
  # PertMind's λ values are "not found" (paper Appendix A); our suggestion.
  config.pertmind = dict(lambda_pw=0.0 if arg.reward == "gene" else 0.3, lambda_fmt=0.1,
                         use_conf=True)
  config.loss.beta = 0.02  # sampled-token k3 KL to the frozen starting (SFT) policy
  config.trim_completions_to = 0  # the grammar fixes the length: nothing to trim
  config.optimizer.lr = 1e-4
  config.eval_pass_k = 0
  config.max_new_tokens = COMPLETION_LEN
  if arg.runlocal:  # base_configs' runlocal shrink: 4 steps of 2 prompts × 4 samples
    config.num_train_examples = 64
  else:
    config.prompts_per_step = 16
    config.group_size = 8
    config.steps = 40
    config.eval_examples = 128
  return config


def sweep(add, arg=None):
  """3 seeds × the three rewards of the ablation."""
  del arg
  for seed in (0, 1, 2):
    for reward in REWARDS:
      add(**{"seed": seed, "pertmind.lambda_pw": 0.0 if reward == "gene" else 0.3,
             "task_knobs.pathway_labels": "shuffled" if reward == "shuffled" else "true"})
