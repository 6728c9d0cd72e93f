"""The PPO critic: the value model's position alignment, its copy of the policy, its scoring
pass in micro-batches, sharding like the policy, and the `config.critic` checks."""

import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.methods import critic as critic_lib
from jaxrl_post.methods.step_parts import build_step_parts
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.value import ValueModel, score_values
from jaxrl_post.parallel.axes import DEFAULT_RULES
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.training import base_configs
from jaxrl_post.training.train_state import create_train_state

P, T = 5, 6  # prompt and completion widths


@pytest.fixture(scope="module")
def mesh():
  return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tensor"))


@pytest.fixture(scope="module")
def policy(mesh):
  """`tiny`, its parameters born sharded by the default rules (a jitted initialiser)."""
  return init_sharded(lambda: CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(0)), mesh,
                      DEFAULT_RULES)


@pytest.fixture(scope="module")
def critic(policy):
  """A critic from the policy with a random head (a zero head predicts 0 everywhere)."""
  graphdef, params = nnx.split(policy)
  model = ValueModel.from_policy(graphdef, params)
  model.head.set_value(jax.random.normal(jax.random.key(1), model.head.get_value().shape))
  model.head_bias.set_value(jnp.float32(0.3))
  return model


def _rows(seed=0):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, 200, size=(3, P)).astype(np.int32)
  prompt_mask = np.ones((3, P), bool)
  prompt_mask[1, :2] = False  # left padding
  completion = rng.integers(3, 200, size=(3, T)).astype(np.int32)
  completion_mask = np.arange(T)[None] < np.array([[T], [4], [1]])  # right padding
  return prompt, prompt_mask, completion, completion_mask


def test_value_j_is_read_before_completion_token_j(critic):
  graphdef, params = nnx.split(critic)
  values_of = jax.jit(lambda *x: nnx.merge(graphdef, params).completion_values(*x))
  prompt, prompt_mask, completion, completion_mask = _rows()
  values = np.asarray(values_of(prompt, prompt_mask, completion, completion_mask))
  # The same as the all-positions call read at P − 1 + j.
  full = jax.jit(lambda t, m: nnx.merge(graphdef, params)(t, attention_mask=m))(
    np.concatenate([prompt, completion], 1), np.concatenate([prompt_mask, completion_mask], 1))
  np.testing.assert_allclose(values, np.where(completion_mask, full[:, P - 1:-1], 0.0),
                             atol=1e-6)
  assert not values[~completion_mask].any()
  # Value j depends on completion tokens < j only: changing token k leaves values 0…k alone and
  # changes the values after it.
  k = 2
  changed = completion.copy()
  changed[:, k] = (changed[:, k] + 7) % 200 + 3
  again = np.asarray(values_of(prompt, prompt_mask, changed, completion_mask))
  np.testing.assert_array_equal(again[0, :k + 1], values[0, :k + 1])
  assert np.all(np.abs(again[0, k + 1:] - values[0, k + 1:]) > 1e-7)
  # The prompt's last token is state 0: changing it moves every value.
  prompt2 = prompt.copy()
  prompt2[:, -1] = (prompt2[:, -1] + 7) % 200 + 3
  moved = np.asarray(values_of(prompt2, prompt_mask, completion, completion_mask))
  assert abs(moved[0, 0] - values[0, 0]) > 1e-7


def test_from_policy_copies_the_trunk_with_a_zero_head_and_no_lm_head(policy):
  graphdef, params = nnx.split(policy)
  model = ValueModel.from_policy(graphdef, params)
  assert model.trunk.lm_head is None and policy.lm_head is not None
  np.testing.assert_array_equal(model.trunk.embed.get_value(), policy.embed.get_value())
  assert not model.head.get_value().any() and float(model.head_bias.get_value()) == 0.0
  model.trunk.embed.set_value(model.trunk.embed.get_value() + 1.0)  # a copy, not an alias
  assert not np.allclose(model.trunk.embed.get_value(), policy.embed.get_value())


def test_score_values_in_micro_batches_equals_one_pass(critic):
  graphdef, params = nnx.split(critic)
  rows = [np.concatenate([a, b]) for a, b in zip(_rows(0), _rows(1))][:4]  # 6 rows
  def values(params, *rows, m):
    return score_values(graphdef, params, *rows, num_micro_batches=m)

  one = jax.jit(values, static_argnames="m")(params, *rows, m=1)
  three = jax.jit(values, static_argnames="m")(params, *rows, m=3)
  np.testing.assert_allclose(three, one, atol=1e-5)
  with pytest.raises(ValueError, match="score_micro_batches=4"):
    score_values(graphdef, params, *rows, num_micro_batches=4)


def test_critic_is_sharded_by_the_policy_rules(policy, mesh):
  graphdef, params = nnx.split(policy)
  model = ValueModel.from_policy(graphdef, params)
  state = create_train_state(model, base_configs_optimizer(), jax.random.key(0), mesh=mesh)
  critic_q = state.params["trunk"]["layers"][0]["attn"]["q_proj"]
  policy_q = params["layers"][0]["attn"]["q_proj"]
  assert critic_q.sharding.is_equivalent_to(policy_q.sharding, policy_q.ndim)
  assert not critic_q.sharding.is_fully_replicated
  assert state.params["head"].sharding.is_fully_replicated


def base_configs_optimizer():
  from jaxrl_post.training.setup import build_optimizer

  config = ml_collections.ConfigDict(dict(optimizer=base_configs.optimizer_config(lr=1e-3)))
  return build_optimizer(config, 10)


def _config(**critic):
  config = base_configs.grpo_base("ppo")
  config.critic = ml_collections.ConfigDict(dict(
    enabled=True, gamma=1.0, lam=1.0, value_clip=0.2, kl_in_reward=0.0, epochs=1,
    optimizer=base_configs.optimizer_config(lr=1e-4)))
  config.critic.update(critic)
  return config


@pytest.mark.parametrize("knobs, match", [
  (dict(gamma=1.5), r"config.critic.gamma=1.5 must be in \[0, 1\]"),
  (dict(gamma=-0.1), r"config.critic.gamma=-0.1 must be in \[0, 1\]"),
  (dict(lam=2.0), r"config.critic.lam=2.0 must be in \[0, 1\]"),
  (dict(value_clip=-0.2), "config.critic.value_clip=-0.2 must be >= 0"),
  (dict(kl_in_reward=-1.0), "config.critic.kl_in_reward=-1.0 must be >= 0"),
  (dict(epochs=0), "config.critic.epochs=0 must be >= 1"),
])
def test_bad_config_names_the_key(knobs, match):
  with pytest.raises(ValueError, match=match):
    critic_lib.build_critic(_config(**knobs))


def test_critic_part_is_built_only_when_enabled():
  assert critic_lib.build_critic(base_configs.grpo_base()) is None
  assert critic_lib.build_critic(_config(enabled=False)) is None
  parts = build_step_parts(_config(), task=None)
  assert isinstance(parts["critic"], critic_lib.Critic)
  config = _config()
  config.replay = ml_collections.ConfigDict(dict(name="headroom"))
  with pytest.raises(ValueError, match="config.replay.name='headroom'"):
    critic_lib.build_critic(config)
  config = _config()
  config.lora = ml_collections.ConfigDict(dict(rank=8))
  with pytest.raises(ValueError, match="config.lora.rank=8"):
    critic_lib.build_critic(config)


class _Scorer:
  """Reference log-probs of −1 per token, as a frozen `Sampler.score` would return them."""

  def score(self, params, prompt_tokens, prompt_mask, completion_tokens, completion_mask, **kw):
    del params, prompt_tokens, prompt_mask, completion_tokens, kw
    return types.SimpleNamespace(logp=np.where(completion_mask, -1.0, 0.0).astype(np.float32))


def test_transform_builds_token_rewards_gae_and_the_critic_batch():
  # Two rows (no whitening, γ = λ = 1): V_old = 0.25 everywhere, old_logp = −0.5 and the
  # reference's −1, so k1 = 0.5 per token and β_kl = 0.1 takes 0.05 per token.
  #   row 0 (3 tokens, reward 1·1 + 0.5·1 = 1.5): A_j = Σ_{k≥j} r_k − V_j =
  #     [1.5 − 0.15 − 0.25, 1.5 − 0.10 − 0.25, 1.5 − 0.05 − 0.25] = [1.1, 1.15, 1.2]
  #   row 1: every reward missing (NaN): advantage 0, left out of the value loss.
  part = critic_lib.build_critic(_config(kl_in_reward=0.1, whiten=False))
  part.values_fn = lambda params, inputs: np.where(inputs["completion_mask"], 0.25, 0.0)
  part.reference, part.state = "reference", types.SimpleNamespace(params=None)
  objective = types.SimpleNamespace(reward_names=["correct", "format"],
                                    reward_weights=jnp.asarray([1.0, 0.5]))
  method = types.SimpleNamespace(objective=objective, scorer=_Scorer(), config=_config())
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
  batch = dict(prompt_tokens=np.ones((2, 3), np.int32), prompt_mask=np.ones((2, 3), bool),
               completion_tokens=np.ones((2, 4), np.int32), completion_mask=mask,
               old_logp=np.where(mask, -0.5, 0.0).astype(np.float32), adv=np.ones(2))
  verified = types.SimpleNamespace(correct=np.array([1.0, np.nan]),
                                   format=np.array([1.0, np.nan]))
  ctx = types.SimpleNamespace(verified=verified, put=lambda x: x, step=1)
  out, metrics = part.transform(method, None, batch, ctx)
  np.testing.assert_allclose(out["adv"], [[1.1, 1.15, 1.2, 0], [0, 0, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(out["returns"], [[1.35, 1.4, 1.45, 0], [0, 0, 0, 0]], atol=1e-6)
  np.testing.assert_array_equal(out["value_mask"], [[1, 1, 1, 0], [0, 0, 0, 0]])
  np.testing.assert_allclose(metrics["critic/kl_in_reward"], 0.5, rtol=1e-6)
  assert set(part.pending) == {*critic_lib.INPUT_KEYS, *critic_lib.CRITIC_KEYS}
  # Whitened (the default): zero mean and unit variance over the valid tokens.
  part.whiten = True
  out, _ = part.transform(method, None, batch, ctx)
  valid = out["adv"][out["value_mask"]]
  np.testing.assert_allclose([valid.mean(), valid.std()], [0.0, 1.0], atol=1e-3)
