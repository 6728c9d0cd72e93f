r"""The on-policy distillation family on one loop: GRPO, OPD, TV-OPD, OPD-then-RL and its
joint baselines, TGOPD, OPDVR / GRPD and OPRD, picked by `config.distill.method`.

  python experiments/opd_family.py --config=configs/opd_family.py:method=tv_opd \
      --workdir=/tmp/opd_family/tv_opd --config.init_from=/tmp/sft_arith \
      --config.distill.teacher=/tmp/grpo_arith
  python experiments/opd_family.py --config=configs/opd_family.py:method=joint:kdrl,runlocal \
      --workdir=/tmp/opd_family_smoke --config.distill.teacher=/tmp/grpo_arith
  python experiments/opd_family.py --config=configs/opd_family.py:method=oprd \
      --workdir=/tmp/opd_family/oprd --config.init_from=/tmp/sft_arith \
      --config.distill.teacher=/tmp/grpo_arith --config.distill.teacher_ref=/tmp/sft_arith

The teacher (and OPRD's teacher reference) is a checkpoint directory: an orbax run of this
codebase or a Hugging Face directory, with the student's vocabulary. Killed and restarted with
the same command, a run resumes from its last checkpoint (TV-OPD's scheduler state and
OPD-then-RL's evaluation history included). The method is jaxrl_post/methods/opd_family.py,
the loop jaxrl_post/training/loop.py, the configs configs/opd_family.py.
"""

from jaxrl_post.methods.opd_family import OPDFamily
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(OPDFamily)
