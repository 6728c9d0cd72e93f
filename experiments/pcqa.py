r"""PCQA-R1 (arXiv 2608.18627) on synthetic point clouds: one stage or method per run.

  python experiments/pcqa.py --config=configs/pcqa_synthetic.py:method=base \
      --workdir=/tmp/pcqa/seed_0/base
  python experiments/pcqa.py --config=configs/pcqa_synthetic.py:method=rank \
      --workdir=/tmp/pcqa/seed_0/rank --config.init_from=/tmp/pcqa/seed_0/base
  python experiments/pcqa.py --config=configs/pcqa_synthetic.py:runlocal,method=base \
      --workdir=/tmp/pcqa_smoke/seed_0/base

The whole grid (seeds × base / capable / methods, each run after the one it starts from) and
its table:

  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py --workdir=/tmp/pcqa
  python scripts/pcqa_table.py --workdir=/tmp/pcqa --out=docs/pcqa

`config.method` (the config argument `method=`) is base, capable, cold_start, sft, rank,
rank_gauss, full or regression (configs/pcqa_synthetic.py says what each trains and where it
starts). A run writes `metrics.jsonl`, TensorBoard events, checkpoints and, at its last
evaluation, `final.json`; killed and restarted with the same command, it resumes from its last
checkpoint. Devices come from `config.mesh` (`--config.mesh.ici_data/ici_fsdp/ici_tensor`); the
model's parameters are born sharded on the trainer's mesh. The method is
jaxrl_post/methods/pcqa.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.pcqa import PCQA
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(PCQA)
