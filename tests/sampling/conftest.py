"""The sampler tests' model: `tiny` Qwen3 with a 32-token vocabulary and a peaked distribution."""

import jax
import pytest
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config

VOCAB = 32


@pytest.fixture(scope="module")
def model():
  # A small vocabulary makes distribution tests cheap; weights ×4 make the next-token
  # distribution far from uniform, so a wrong one is visible and EOS / stop tokens end rows
  # at many different lengths.
  config = get_model_config("tiny", vocab_size=VOCAB, family="qwen3", qk_norm=True)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, state)
  return nnx.merge(graphdef, state)
