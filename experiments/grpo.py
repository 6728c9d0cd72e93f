r"""GRPO-family RL on a verifiable task: sample → reward → advantages → update → evaluate.

  python experiments/grpo.py --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith \
      --config.init_from=/tmp/sft_arith
  python experiments/grpo.py --config=configs/grpo_arith.py:runlocal --workdir=/tmp/grpo_smoke \
      --config.init_from=/tmp/sft_smoke

The policy loss, advantage estimator and KL are chosen by name in the config
(`config.loss.name`, `config.advantage`, `config.loss.beta`); see jaxrl_post.losses. Killed and
restarted with the same command, the run resumes from its last checkpoint.

Devices come from `config.mesh` (jaxrl_post.parallel.mesh): the trainer shards over
`--config.mesh.ici_data/ici_fsdp/ici_tensor`, and the sampler shares its devices or, with
`--config.mesh.sampler_devices=n`, has the last n to itself. The method is
jaxrl_post/methods/grpo.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(GRPO)
