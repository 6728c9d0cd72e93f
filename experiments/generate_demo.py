r"""Generates from a model with `jaxrl_post.sampling.Sampler`, the sampler the RL binaries use.

  python experiments/generate_demo.py                       # `small`, random init, CPU
  python experiments/generate_demo.py --model=tiny --max_new_tokens=16
  python experiments/generate_demo.py --hf_checkpoint=/path/to/Qwen3-0.6B \
      --prompt="The capital of France is"

A randomly initialised model prints gibberish; the point is the machinery on its own:
preset (or a Hugging Face directory with config.json, safetensors and tokenizer.json, loaded by
`models.hf.load_hf`) → NNX model → tokenizer → `Sampler.generate` (prompts padded to a bucket,
jitted prefill, jitted decode loop over the KV cache that stops at EOS) → `Sampler.decode_text`.
`--batch` copies of the prompt are decoded greedily, so every row prints the same text; the
timed call is the second one (the first compiles), and tokens/s counts the tokens generated,
prefill included in the time.
"""

import time

import jax
import numpy as np
from absl import app, flags, logging
from flax import nnx

from jaxrl_post import tokenizers
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import load_hf
from jaxrl_post.sampling import FINISH_NAMES, Sampler

_MODEL = flags.DEFINE_string("model", "small", "Model preset (jaxrl_post.models.configs).")
_HF_CHECKPOINT = flags.DEFINE_string("hf_checkpoint", None,
                                     "Hugging Face checkpoint directory; overrides --model.")
_PROMPT = flags.DEFINE_string("prompt", "12+7=", "Prompt text.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 48, "Most tokens generated a row.")
_BATCH = flags.DEFINE_integer("batch", 4, "Copies of the prompt decoded together.")
_SEED = flags.DEFINE_integer("seed", 0, "Initialisation seed.")


def main(argv):
  del argv
  # ---- Model & tokenizer ----
  if _HF_CHECKPOINT.value:
    model = load_hf(_HF_CHECKPOINT.value)
    tokenizer = tokenizers.get_tokenizer(_HF_CHECKPOINT.value)
  else:
    tokenizer = tokenizers.CharTokenizer()
    config = get_model_config(_MODEL.value, vocab_size=tokenizer.vocab_size)
    model = CausalLM(config, rngs=nnx.Rngs(_SEED.value))
  logging.info("model: %s, %.2fM parameters", model.config.family,
               model.config.num_params() / 1e6)

  # ---- Generate ----
  sampler = Sampler(model, tokenizer)
  prompts = [_PROMPT.value] * _BATCH.value

  def generate():
    rollout = sampler.generate(None, prompts, max_new_tokens=_MAX_NEW_TOKENS.value, greedy=True)
    return jax.block_until_ready(rollout)

  generate()  # Compiles the prefill and decode kernels for this batch and prompt bucket.
  start = time.perf_counter()
  rollout = generate()
  seconds = time.perf_counter() - start
  generated = int(np.sum(jax.device_get(rollout.completion_mask)))
  finish = FINISH_NAMES[int(rollout.finish_reason[0])]
  print(f"prompt:     {_PROMPT.value!r}")
  print(f"completion: {sampler.decode_text(rollout)[0]!r} (finished by {finish})")
  print(f"{generated / seconds:,.0f} tokens/s ({generated} tokens generated over {_BATCH.value} "
        f"rows of at most {_MAX_NEW_TOKENS.value} in {seconds:.3f} s, prefill included, on "
        f"{jax.devices()[0].platform})")


if __name__ == "__main__":
  app.run(main)
