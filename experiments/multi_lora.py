r"""Multi-LoRA RL: several GRPO-family runs ("tenants"), one adapter each, on one frozen base.

  python experiments/multi_lora.py --config=configs/multi_lora.py --workdir=/tmp/multi_lora \
      --config.init_from=/tmp/sft_arith
  python scripts/export_hf.py --run_dir=/tmp/multi_lora --adapter=plus --out=/tmp/plus_hf

Each tenant is `config` with `config.multi_lora.tenants.<name>`'s overrides (its task, seed,
loss, optimizer, ...); metrics are logged per tenant (`train/<name>/…`, `eval/<name>/…`) and
the checkpoint holds every tenant's adapters and optimizer state. Killed and restarted with the
same command, every tenant resumes from the last checkpoint. The method is
jaxrl_post/methods/multi_lora.py, the loop jaxrl_post/training/loop.py.
"""

from jaxrl_post.methods.multi_lora import MultiLoRA
from jaxrl_post.training import loop

if __name__ == "__main__":
  loop.main(MultiLoRA)
