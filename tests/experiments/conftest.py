"""Fixtures shared by the binaries' tests."""

from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jaxrl_post import tokenizers
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import save_hf


def _format_writer(path: Path) -> Path:
  """A `tiny` policy that writes `#### <digits>` with a random number of `#`s, as HF weights.

  A scratch policy never earns the arithmetic task's format reward, so every
  advantage, loss and gradient of a scratch run is 0, and comparing meshes
  would compare zeros. This one is nearly a bigram model: the layers' output
  projections are scaled down, so the last hidden state is the current
  token's embedding, a one-hot "state", which `lm_head` maps to next-token
  log-probs: prompt end → `#`; `#` → `#` (3/4) or ` ` (1/4); ` ` → a digit;
  digit → a digit or EOS (1/2 each). About one completion in ten has exactly
  four `#`s (format reward 1), so some groups have non-zero advantages, and
  the layers' small random weights still take part in every gradient.
  """
  tokenizer = tokenizers.get_tokenizer("char")
  digits = tokenizer.encode("0123456789")
  hash_, space, eos = tokenizer.token_to_id("#"), tokenizer.token_to_id(" "), tokenizer.eos_id
  state_of = {hash_: 1, space: 2, **{d: 3 for d in digits}}  # Everything else: state 0.
  nexts = [{hash_: 1.0}, {hash_: 0.75, space: 0.25}, {d: 0.1 for d in digits},
           {eos: 0.5, **{d: 0.05 for d in digits}}]
  config = get_model_config("tiny", vocab_size=tokenizer.vocab_size)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  d = config.embed_dim
  embed = np.zeros((config.vocab_size, d), np.float32)
  embed[np.arange(config.vocab_size), [state_of.get(t, 0) for t in range(config.vocab_size)]] = (
    np.sqrt(d))  # RMS 1: the final norm leaves it as is.
  lm_head = np.zeros((d, config.vocab_size), np.float32)
  for state, probs in enumerate(nexts):
    logp = np.full(config.vocab_size, np.log(1e-6), np.float32)
    logp[list(probs)] = np.log(list(probs.values()))
    lm_head[state] = logp / np.sqrt(d)
  model.embed.set_value(embed)
  model.lm_head.set_value(lm_head)
  for layer in model.layers:
    layer.attn.o_proj.set_value(0.02 * layer.attn.o_proj.get_value())
    layer.mlp.down_proj.set_value(0.02 * layer.mlp.down_proj.get_value())
  save_hf(model, path)
  return path


@pytest.fixture(scope="session")
def format_writer_policy(tmp_path_factory):
  """HF weights of `_format_writer`: a GRPO start whose `runlocal` steps have non-zero signal."""
  return _format_writer(tmp_path_factory.mktemp("format_writer"))
