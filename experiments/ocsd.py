r"""OCSD, observation-calibrated self-distillation (arXiv 2608.04788), on the multi-turn envs.

  python experiments/ocsd.py --config=configs/ocsd.py:method=sft --workdir=/tmp/ocsd_kv/sft
  python experiments/ocsd.py --config=configs/ocsd.py --workdir=/tmp/ocsd_kv/s0/ocsd \
      --config.init_from=/tmp/ocsd_kv/sft
  python experiments/ocsd.py --config=configs/ocsd.py:runlocal --workdir=/tmp/ocsd_smoke

The same binary as experiments/rtpo.py (`methods.rtpo.RTPO`): `method=ocsd` is turn-level GRPO
whose turn batch gets OCSD's per-token advantages before the PPO phase
(`methods.ocsd.Calibrator`); `method=turn_grpo` is the baseline, and every other mode of
experiments/rtpo.py runs here too. Metrics add `ocsd/q_mean`, `ocsd/q_abs_mean`,
`ocsd/selected_frac`, `ocsd/adv_factor_mean` and `time/ocsd_score` to turn GRPO's. A killed run
resumes from its last checkpoint with the same command (or more `--config.steps`).
"""

from jaxrl_post.methods.rtpo import RTPO
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(RTPO)
