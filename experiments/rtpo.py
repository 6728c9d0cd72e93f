r"""Multi-turn agentic RL: RTPO (arXiv 2608.18682) against turn-level and flattened GRPO.

  python experiments/rtpo.py --config=configs/rtpo_calculator.py:method=sft,horizon=4 \
      --workdir=/tmp/rtpo/sft_k4
  python experiments/rtpo.py --config=configs/rtpo_calculator.py:method=rtpo,horizon=4 \
      --workdir=/tmp/rtpo/rtpo_k4 --config.init_from=/tmp/rtpo/sft_k4
  python experiments/rtpo.py --config=configs/rtpo_kv.py:method=rtpo,horizon=2,runlocal \
      --workdir=/tmp/rtpo_smoke --config.init_from=/tmp/rtpo/sft_k4

`method` is `sft` (cold start on the env's demonstrations, each turn under ψ), `flat_grpo`,
`turn_grpo` or `rtpo`. Every run counts the tokens it generates for training
(`budget/generated_tokens`) and stops at `config.max_generated_tokens`, so methods can be
compared at equal sampling budgets; `eval/success` is the greedy success rate on held-out
episodes and `eval/sampled_success` the success of sampling at the training temperature.
Killed and restarted with the same command, a run resumes from its last checkpoint and logs the
same metrics as one that never stopped (wall-clock times aside).

Devices come from `config.mesh` (jaxrl_post.parallel.mesh): updates shard over
`--config.mesh.ici_data/ici_fsdp/ici_tensor`, and rollouts share those devices or, with
`--config.mesh.sampler_devices=n`, run on the last n. The method is jaxrl_post/methods/rtpo.py,
the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.rtpo import RTPO
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(RTPO)
