r"""CrystalGRPO (arXiv 2608.06582) on toy crystals: flow-matching pretraining on the polymorphs,
then GRPO in mode q (target-aligned), c (coverage-preserving) or energy-only.

  python experiments/crystal_grpo.py --config=configs/crystal_grpo.py:method=pretrain \
      --workdir=/tmp/crystal_grpo/s0/pretrain
  python experiments/crystal_grpo.py --config=configs/crystal_grpo.py:method=grpo,mode=q \
      --workdir=/tmp/crystal_grpo/s0/q --config.init_from=/tmp/crystal_grpo/s0/pretrain
  python experiments/crystal_grpo.py --config=configs/crystal_grpo.py:method=grpo,mode=c \
      --workdir=/tmp/crystal_grpo/s0/c --config.init_from=/tmp/crystal_grpo/s0/pretrain
  python experiments/crystal_grpo.py --config=configs/crystal_grpo.py:runlocal,method=pretrain \
      --workdir=/tmp/crystal_grpo_smoke/pretrain

A run writes `metrics.jsonl` (eval/mr1, eval/mr_top, eval/rmse1, …) and checkpoints; killed and
restarted with the same command, it resumes. The reproduction (3 seeds, energy-only vs Q vs C):
scripts/crystal_grpo_modes.py. The method is jaxrl_post/methods/crystal_grpo.py, the loop
jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.crystal_grpo import CrystalGRPO
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(CrystalGRPO)
