r"""Flow-GRPO (arXiv 2505.05470) with LeanGRPO's gradient schedules (arXiv 2609.03528) on a 2-D
Gaussian mixture: flow-matching pretraining, then GRPO from it.

  python experiments/flow_grpo.py --config=configs/flow_grpo.py:method=pretrain \
      --workdir=/tmp/flow_grpo/s0/pretrain
  python experiments/flow_grpo.py --config=configs/flow_grpo.py:method=grpo,schedule=native \
      --workdir=/tmp/flow_grpo/s0/native --config.init_from=/tmp/flow_grpo/s0/pretrain
  python experiments/flow_grpo.py --config=configs/flow_grpo.py:runlocal,method=pretrain \
      --workdir=/tmp/flow_grpo_smoke/pretrain

`config.flow.schedule` (native | retain | reweight) picks how the GRPO gradient is computed;
all three give the same update for the same noise (tests/training/test_lean_grpo.py). A run
writes `metrics.jsonl` and checkpoints; killed and restarted with the same command, it resumes.
With `--config.mesh.ici_data=R` the gradient runs with the shared-prompt layout over R devices.
The reproduction (3 seeds, plot, schedule timings): scripts/flow_grpo_schedules.py. The method
is jaxrl_post/methods/flow_grpo.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.flow_grpo import FlowGRPO
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(FlowGRPO)
