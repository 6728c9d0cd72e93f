r"""ReflectRL (arXiv 2608.03972): GRPO whose groups mix reflective prompts (the problem and a
golden negative trajectory to find the error in) with direct ones, the reflective share falling
to zero on a cosine schedule; evaluation on direct prompts only.

  python experiments/reflect_rl.py --config=configs/reflect_rl.py \
      --workdir=/tmp/reflect_rl/reflect --config.init_from=/tmp/sft_arith
  python experiments/reflect_rl.py --config=configs/reflect_rl.py \
      --workdir=/tmp/reflect_rl/grpo --config.init_from=/tmp/sft_arith \
      --config.reflect.p_high=0
  python experiments/reflect_rl.py --config=configs/reflect_rl.py:runlocal,kernel=linear \
      --workdir=/tmp/reflect_rl_smoke
  python experiments/reflect_rl.py --config=configs/reflect_rl.py \
      --workdir=/tmp/reflect_rl/jsonl --config.reflect.negatives_path=/data/gnt.jsonl

The second command is the GRPO baseline (`reflect.p_high=0`: no reflective row ever). Killed
and restarted with the same command, a run resumes from its last checkpoint (the data position
included; the schedule is a function of the step). The method is
jaxrl_post/methods/reflect_rl.py, the loop jaxrl_post/training/loop.py, the configs
configs/reflect_rl.py.
"""

from jaxrl_post.methods.reflect_rl import ReflectRL
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(ReflectRL)
