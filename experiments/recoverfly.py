r"""RecoverFly (arXiv 2608.09467): failure-aware token-level RL on synthetic aerial navigation.

  python experiments/sft.py --config=configs/recoverfly.py:sft --workdir=/tmp/rf_sft
  python experiments/recoverfly.py --config=configs/recoverfly.py --workdir=/tmp/rf \
      --config.init_from=/tmp/rf_sft
  python experiments/recoverfly.py --config=configs/recoverfly.py:runlocal --workdir=/tmp/rf_l

`variant=grpo|replay|curriculum|kl|all` picks the ablation arm (configs/recoverfly.py); the
five arms over 3 seeds, with a matched rollout budget: scripts/recoverfly_ablation.py. A run
writes `metrics.jsonl`, TensorBoard events and checkpoints (the failure buffer included);
killed and restarted with the same command, it resumes from its last checkpoint. The method is
jaxrl_post/methods/recoverfly.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.recoverfly import RecoverFly
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(RecoverFly)
