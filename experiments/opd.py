r"""Multi-teacher on-policy distillation (Open-MOPD, arXiv 2608.19098) on a task mixture.

  python experiments/opd.py --config=configs/opd_mix.py:root=/tmp/mopd,method=open_mopd \
      --workdir=/tmp/mopd/open_mopd
  python experiments/opd.py --config=configs/opd_mix.py:runlocal --workdir=/tmp/opd_smoke \
      --config.teachers.arith=/tmp/sft_mix --config.teachers.countdown=/tmp/sft_mix \
      --config.teachers.format=/tmp/sft_mix     # after experiments/sft.py ...:sft,runlocal

Each step: draw a batch with exact per-domain quotas → the student samples one response per
prompt → its top-K ids V and log-probs s on them → each row's routed teacher scores V (q) →
rollout-time rewards r = (q − s)·softmax_K(s) → per-domain weights from the whole batch's
statistics → K mini-batch updates of dual-clip PPO on V (reward refreshed with each update's
student when the method says so) → per-domain metrics and evaluation. The method
(`config.method`: naive, token_share, gap, open_mopd) sets the switches; configs/opd_mix.py has
the whole pipeline (mixed SFT, GRPO teachers, RouteRL reference). Killed and restarted with the
same command, the run resumes from its last checkpoint (state, quota-sampler position, the
step-0 reference totals).

Devices come from `config.mesh` (jaxrl_post.parallel.mesh): student and teachers shard over
`--config.mesh.ici_data/ici_fsdp/ici_tensor`; the sampler shares the devices or, with
`--config.mesh.sampler_devices=n`, has the last n to itself. The method is
jaxrl_post/methods/opd.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.opd import OpenMOPD
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(OpenMOPD)
