r"""GTN-R (arXiv 2608.08010): NLL pretraining, then TS-GRPO ± GTN-R, on synthetic series.

  python experiments/gtn_r.py --config=configs/gtn_r.py:stage=pretrain \
      --workdir=/tmp/gtn_r/seed_0/pretrain
  python experiments/gtn_r.py --config=configs/gtn_r.py:variant=neighbourhood_nll \
      --workdir=/tmp/gtn_r/seed_0/neighbourhood_nll --config.init_from=/tmp/gtn_r/seed_0/pretrain
  python experiments/gtn_r.py --config=configs/gtn_r.py:runlocal,stage=pretrain \
      --workdir=/tmp/gtn_r_smoke/pretrain

`config.stage` is pretrain or grpo; `config.gtn_r.variant` is none (TS-GRPO),
neighbourhood_nll (GTN-R A) or anchored_group (GTN-R B). Killed and restarted with the same
command, a run resumes from its last checkpoint. The comparison over 3 seeds:
scripts/gtn_r_collapse.py. The method is jaxrl_post/methods/gtn_r.py, the loop
jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.gtn_r import GTNR
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(GTNR)
