r"""Teacher-forced SFT on a task's demonstrations (the warm start small models need before RL).

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith
  python experiments/sft.py --config=configs/sft_arith.py:runlocal --workdir=/tmp/sft_smoke

Killed and restarted with the same command, the run resumes from its last checkpoint in
`--workdir` (parameters, optimizer, step and data position). Devices come from `config.mesh`
(`--config.mesh.ici_data/ici_fsdp/ici_tensor`; the evaluation sampler plays the sampler's
part); with a launcher's environment (scripts/launch_*.sh) the processes form one run. The
method is jaxrl_post/methods/sft.py, the loop jaxrl_post/training/loop.py.
"""

from absl import app, flags
from ml_collections import config_flags

from jaxrl_post.methods.sft import SFT
from jaxrl_post.training import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  loop.train(_CONFIG.value, _WORKDIR.value, SFT(_CONFIG.value))


if __name__ == "__main__":
  app.run(main)
