r"""Progressive LP → FFT → RFT for a recommender foundation model (arXiv 2608.06792): one phase
per run, each after the run it starts from.

  python experiments/progressive_recsys.py --config=configs/progressive_recsys.py:phase=pretrain \
      --workdir=/tmp/prs/seed_0/pretrain
  python experiments/progressive_recsys.py --config=configs/progressive_recsys.py:phase=lp \
      --workdir=/tmp/prs/seed_0/lp --config.init_from=/tmp/prs/seed_0/pretrain
  python experiments/progressive_recsys.py --config=configs/progressive_recsys.py:phase=fft \
      --workdir=/tmp/prs/seed_0/fft --config.init_from=/tmp/prs/seed_0/lp
  python experiments/progressive_recsys.py --config=configs/progressive_recsys.py:phase=rft \
      --workdir=/tmp/prs/seed_0/rft --config.init_from=/tmp/prs/seed_0/fft
  python experiments/progressive_recsys.py \
      --config=configs/progressive_recsys.py:runlocal,phase=pretrain --workdir=/tmp/prs_smoke

The whole grid (3 seeds × pretrain / sft1 / lp / fft / rft) and its table:

  python scripts/progressive_recsys_grid.py --workdir=/tmp/progressive_recsys

`config.phase` (the config argument `phase=`) is pretrain, sft1, lp, fft or rft
(configs/progressive_recsys.py says what each trains and where it starts; `config.phases`
gives each parameter group's learning-rate multiplier). A run writes `metrics.jsonl`,
TensorBoard events, checkpoints and, at its last evaluation, `final.json`; killed and restarted
with the same command, it resumes from its last checkpoint. The method is
jaxrl_post/methods/progressive_recsys.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.progressive_recsys import ProgressiveRecsys
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(ProgressiveRecsys)
