r"""Autoregressive dense detection: SFT by teacher forcing, then GRPO with a set-level count reward.

  python experiments/perception.py --config=configs/perception_dense.py:phase=sft \
      --workdir=/tmp/perc/sft
  python experiments/perception.py --config=configs/perception_dense.py:phase=rl \
      --workdir=/tmp/perc/rl --config.init_from=/tmp/perc/sft
  python experiments/perception.py --config=configs/perception_dense.py:phase=sft_more \
      --workdir=/tmp/perc/sft_more --config.init_from=/tmp/perc/sft
  python experiments/perception.py --config=configs/perception_dense.py:runlocal \
      --workdir=/tmp/perc_smoke/sft

Falcon Perception-HD (arXiv 2608.18881) on `jaxrl_post.tasks.dense_scenes`; one run is one phase
(`sft`, `rl` = count-reward GRPO with Clip-Cov and the engine-mismatch IS weight, `sft_more` = the
longer-SFT control). Killed and restarted with the same command, a run resumes from its last
checkpoint. Devices come from `config.mesh` (`--config.mesh.ici_data/ici_fsdp/ici_tensor`,
`--config.mesh.sampler_devices=n` for a decode loop on devices of its own). The method is
jaxrl_post/methods/perception.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.perception import Perception
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(Perception)
