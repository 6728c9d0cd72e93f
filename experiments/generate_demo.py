r"""Builds a model and generates from it with the KV cache (the first-run demo).

Until the GRPO experiment lands this is the README's first command:

  python experiments/generate_demo.py                       # `small`, random init, CPU
  python experiments/generate_demo.py --model=tiny --max_new_tokens=16
  python experiments/generate_demo.py --hf_checkpoint=/path/to/Qwen3-0.6B \
      --prompt="The capital of France is"

A randomly initialised model prints gibberish; the point is the machinery:
preset → NNX model → tokenizer → jitted prefill → jitted decode loop over a
donated cache, with tokens/s. A Hugging Face directory (config.json,
safetensors, tokenizer.json) loads through `models.hf.load_hf` instead.
"""

import functools
import time

import jax
import jax.numpy as jnp
from absl import app, flags, logging
from flax import nnx

from jaxrl_post import tokenizers
from jaxrl_post.models import CausalLM, default_positions, get_model_config
from jaxrl_post.models.hf import load_hf

_MODEL = flags.DEFINE_string("model", "small", "Model preset (jaxrl_post.models.configs).")
_HF_CHECKPOINT = flags.DEFINE_string("hf_checkpoint", None,
                                     "Hugging Face checkpoint directory; overrides --model.")
_PROMPT = flags.DEFINE_string("prompt", "12+7=", "Prompt text.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 48, "Tokens to generate.")
_BATCH = flags.DEFINE_integer("batch", 4, "Copies of the prompt decoded together.")
_SEED = flags.DEFINE_integer("seed", 0, "Initialisation seed.")


@functools.partial(jax.jit, static_argnums=(0, 4))
def _greedy(graphdef, state, tokens, mask, max_new_tokens):
  model = nnx.merge(graphdef, state)
  batch, prompt_len = tokens.shape
  cache = model.init_cache(batch, prompt_len + max_new_tokens)
  positions = default_positions(mask)
  logits, cache = model(tokens, positions=positions, attention_mask=mask, cache=cache)
  first = jnp.argmax(logits[:, -1], -1)

  def body(i, carry):
    out, token, position, cache = carry
    logits, cache = model(token[:, None], positions=position[:, None], cache=cache)
    token = jnp.argmax(logits[:, -1], -1)
    return out.at[:, i].set(token), token, position + 1, cache

  out = jnp.zeros((batch, max_new_tokens), jnp.int32).at[:, 0].set(first)
  init = (out, first, positions[:, -1] + 1, cache)
  return jax.lax.fori_loop(1, max_new_tokens, body, init)[0]


def greedy_generate(model: CausalLM, tokens: jax.Array, mask: jax.Array, max_new_tokens: int):
  """Greedy decoding: prefill, then a `fori_loop` of cached single-token steps, in one jit."""
  graphdef, state = nnx.split(model)
  return _greedy(graphdef, state, tokens, mask, max_new_tokens)


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
  tokens, mask = tokenizer.encode_batch([_PROMPT.value] * _BATCH.value)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  greedy_generate(model, tokens, mask, _MAX_NEW_TOKENS.value).block_until_ready()  # compile
  start = time.perf_counter()
  out = greedy_generate(model, tokens, mask, _MAX_NEW_TOKENS.value)
  out.block_until_ready()
  seconds = time.perf_counter() - start
  completion = tokenizer.decode([int(t) for t in out[0]])
  print(f"prompt:     {_PROMPT.value!r}")
  print(f"completion: {completion!r}")
  print(f"{out.size / seconds:,.0f} tokens/s ({_BATCH.value} rows × {_MAX_NEW_TOKENS.value} "
        f"tokens in {seconds:.3f} s, prefill included, on {jax.devices()[0].platform})")


if __name__ == "__main__":
  app.run(main)
