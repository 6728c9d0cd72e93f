r"""Teacher-forced SFT on a task's demonstrations (the warm start small models need before RL).

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith
  python experiments/sft.py --config=configs/sft_arith.py:runlocal --workdir=/tmp/sft_smoke

Killed and restarted with the same command, the run resumes from its last checkpoint in
`--workdir` (parameters, optimizer, step and data position). Devices come from `config.mesh`
(`--config.mesh.ici_data/ici_fsdp/ici_tensor`; the evaluation sampler plays the sampler's
part); with a launcher's environment (scripts/launch_*.sh) the processes form one run. The
method is jaxrl_post/methods/sft.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.sft import SFT
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(SFT)
