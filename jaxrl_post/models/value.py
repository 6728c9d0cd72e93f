"""A value model: the decoder trunk of a `CausalLM` with a scalar head instead of the LM head.

PPO's critic (InstructGPT, arXiv 2203.02155) scores every prefix of a completion:
V(s_j), s_j = the prompt and completion tokens 0…j−1, is read from the trunk's final hidden
state at the position of the last token of s_j,

  V(s_j) = w · h_{P−1+j} + b,     P = prompt length (prompts are left-padded to P),

so value j is that of the state *before* completion token j, the alignment
`advantages.gae_advantages` expects, and the same shift `sampling.score_model` uses (the
hidden state at P−1+j predicts token j). The head (`w` `[embed]`, `b` a scalar) starts at zero,
so a new critic predicts 0 everywhere; its trunk starts from the policy's weights
(`ValueModel.from_policy`, verl's default critic initialisation), parameters keep their
logical axis names and are sharded by the same rules as the policy. The trunk's LM head is
dropped: a critic never forms logits, and an untied `[embed, vocab]` matrix (and its Adam
moments) would be dead weight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.transformer import CausalLM
from jaxrl_post.parallel import axes


class ValueModel(nnx.Module):
  """`CausalLM` trunk + scalar head: `model(tokens, attention_mask) -> float32[batch, time]`.

  Attributes:
    trunk: the decoder (embedding, layers, final norm); its `lm_head` is None.
    head: `nnx.Param` float32 `[embed]` (logical axis `norm`: replicated), zeros at init.
    head_bias: `nnx.Param` float32 scalar, zero at init.

  Example:
    >>> from jaxrl_post.models import CausalLM, get_model_config
    >>> critic = ValueModel(CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(0)))
    >>> critic(jnp.zeros((2, 5), jnp.int32)).shape
    (2, 5)
  """

  def __init__(self, trunk: CausalLM):
    self.trunk = trunk
    trunk.lm_head = None
    # float32 whatever the trunk's dtype: two small parameters whose rounding would quantise
    # every value the critic predicts. Replicated like the norm scales (`axes.NORM`): sharding
    # one vector saves nothing, and its Adam moments, which `train_state_shardings` places by
    # shape, then agree with those of the `[embed]` norm scales.
    self.head = nnx.Param(jnp.zeros((trunk.config.embed_dim,), jnp.float32),
                          out_sharding=(axes.NORM,), eager_sharding=False)
    self.head_bias = nnx.Param(jnp.zeros((), jnp.float32), out_sharding=(),
                               eager_sharding=False)

  @classmethod
  def from_policy(cls, graphdef, params) -> ValueModel:
    """A critic whose trunk is a *copy* of the policy `nnx.merge(graphdef, params)`.

    Copied, so that updating (and donating) the critic's parameters never touches the
    policy's. Sharded arrays stay in their shards.
    """
    return cls(nnx.merge(graphdef, jax.tree.map(jnp.copy, params)))

  def values_of_hidden(self, hidden: jax.Array) -> jax.Array:
    """`[batch, time, embed]` final hidden states -> float32 `[batch, time]` values."""
    values = jnp.einsum("btd,d->bt", hidden, self.head[...].astype(hidden.dtype),
                        preferred_element_type=jnp.float32)
    return values + self.head_bias[...]

  def __call__(self, tokens: jax.Array, *, attention_mask: jax.Array | None = None
               ) -> jax.Array:
    """Values of every prefix: out[:, i] = V(tokens ≤ i), float32 `[batch, time]`.

    `attention_mask` (bool `[batch, time]`, False on padding) and RoPE positions are those of
    `CausalLM.__call__`.
    """
    hidden = self.trunk(tokens, attention_mask=attention_mask, return_logits=False)
    return self.values_of_hidden(hidden)

  def completion_values(self, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                        completion_tokens: jax.Array, completion_mask: jax.Array
                        ) -> jax.Array:
    """V(s_j) for every completion position j: float32 `[batch, time]`, 0 where masked.

    One forward over prompt + completion, like `sampling.score_model`; value j is read at
    position P − 1 + j (module docstring), so it depends only on the prompt and completion
    tokens 0…j−1.

    Args:
      prompt_tokens, prompt_mask: `[batch, P]`, left-padded.
      completion_tokens, completion_mask: `[batch, time]`, right-padded (or with holes).
    """
    prompt_len = prompt_tokens.shape[1]
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    mask = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(jnp.bool_)
    hidden = self.trunk(tokens, attention_mask=mask, return_logits=False)
    values = self.values_of_hidden(hidden[:, prompt_len - 1:-1])
    return jnp.where(completion_mask.astype(jnp.bool_), values, 0.0)


def score_values(graphdef, params, prompt_tokens, prompt_mask, completion_tokens,
                 completion_mask, *, num_micro_batches: int = 1) -> jax.Array:
  """`ValueModel.completion_values` of a split critic, in micro-batches of rows.

  The frozen pass that gives PPO its V_old over a whole step: micro-batch k takes rows
  k, k + m, k + 2m, … (strided, as `sampling.scoring.score` does, so a batch-sharded array's
  rows stay on their devices), run one after the other under `lax.map` so the activation memory
  is one micro-batch's, then put back in order.

  Raises:
    ValueError: `num_micro_batches` does not divide the rows.
  """
  model = nnx.merge(graphdef, params)
  m, rows = int(num_micro_batches), prompt_tokens.shape[0]
  if m < 1 or rows % m:
    raise ValueError(f"score_micro_batches={num_micro_batches} must be >= 1 and divide the "
                     f"{rows} rows scored together")
  inputs = (prompt_tokens, prompt_mask, completion_tokens, completion_mask)
  if m == 1:
    return model.completion_values(*inputs)
  split = lambda x: jnp.moveaxis(x.reshape(rows // m, m, *x.shape[1:]), 1, 0)  # noqa: E731
  values = jax.lax.map(lambda x: model.completion_values(*x), tuple(map(split, inputs)))
  return jnp.moveaxis(values, 0, 1).reshape(rows, -1)
