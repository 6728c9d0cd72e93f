r"""Exports a run's checkpoint as a Hugging Face model directory (`transformers` loads it).

  python scripts/export_hf.py --run_dir=/tmp/grpo_gsm8k --out=/tmp/grpo_gsm8k_hf
  python scripts/export_hf.py --run_dir=/tmp/grpo_gsm8k --step=400 --dtype=bfloat16 \
      --max_shard_size=2GB --out=/tmp/grpo_gsm8k_step400_hf

Writes config.json, safetensors (sharded above --max_shard_size, with an index), the tokenizer
files of the run's tokenizer and generation_config.json (jaxrl_post/training/export.py). A run
on the character tokenizer exports the model alone, with a warning. The checkpoint may come
from any mesh: the parameters are read into this process's first device, tensor by tensor
when written. A LoRA run (`config.lora.rank` > 0; its checkpoints hold adapters only) exports
merged weights, K + s·a·b, on its base's architecture (`training.run_dir.load_run`); a
multi-LoRA run (one adapter per tenant, `methods.multi_lora`) exports the tenant --adapter names:

  python scripts/export_hf.py --run_dir=/tmp/multi_lora --adapter=plus --out=/tmp/plus_hf

Then:

  model = transformers.AutoModelForCausalLM.from_pretrained("/tmp/grpo_gsm8k_hf")
  tokenizer = transformers.AutoTokenizer.from_pretrained("/tmp/grpo_gsm8k_hf")
"""

from absl import app, flags

from jaxrl_post import script_flags
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.export import export_run

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_RUN_DIR = flags.DEFINE_string("run_dir", None, "A run's --workdir (config.json + checkpoints/).",
                               flag_values=FLAGS, required=True)
_OUT = flags.DEFINE_string("out", None, "The output directory (new or empty).",
                           flag_values=FLAGS, required=True)
_STEP = flags.DEFINE_integer("step", None, "The checkpoint step (default: the latest).",
                             flag_values=FLAGS)
_DTYPE = flags.DEFINE_string("dtype", "", "Tensor dtype and torch_dtype: "
                             f"{', '.join(run_setup.DTYPES)} (default: the run's param_dtype).",
                             flag_values=FLAGS)
_MAX_SHARD_SIZE = flags.DEFINE_string("max_shard_size", "5GB", "Shard the safetensors above "
                                      "this size (5GB = 5·10^9 bytes, 5GiB = 5·2^30).",
                                      flag_values=FLAGS)
_ADAPTER = flags.DEFINE_string("adapter", None, "A multi-LoRA run's tenant whose adapters are "
                                "merged and exported (required there, invalid elsewhere).",
                                flag_values=FLAGS)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the model files of a non-empty "
                               "--out.", flag_values=FLAGS)


def main(argv: list[str]) -> None:
  """Exports and prints what was written (flags only: `argv` is the program name)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  report = export_run(_RUN_DIR.value, _OUT.value, step=_STEP.value, dtype=_DTYPE.value or None,
                      max_shard_size=_MAX_SHARD_SIZE.value, overwrite=_OVERWRITE.value,
                      adapter=_ADAPTER.value)
  print(f"step {report.step} of {_RUN_DIR.value} → {report.path}: {', '.join(report.files)}")
  if not report.tokenizer_exported:
    print("no Hugging Face tokenizer files (the run's tokenizer has none): model only")


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
