r"""ICE (arXiv 2608.02087) on the one loop: DAPO on instruction-conditioned rollouts plus the
filtered forward KL from the conditioned policy to the bare-prompt one (same weights).

  python experiments/ice.py --config=configs/ice.py --workdir=/tmp/ice/ice \
      --config.init_from=/tmp/sft_arith
  python experiments/ice.py --config=configs/ice.py:beta=0 --workdir=/tmp/ice/dapo \
      --config.init_from=/tmp/sft_arith --config.ice.num_instructions=0
  python experiments/ice.py --config=configs/ice.py:runlocal --workdir=/tmp/ice_smoke

Killed and restarted with the same command, a run resumes from its last checkpoint (the data
position is the method's state; each step's contexts are drawn from (seed, step)). The method
is jaxrl_post/methods/ice.py, the loop jaxrl_post/training/loop.py, the config configs/ice.py.
"""

from jaxrl_post.methods.ice import ICE
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(ICE)
