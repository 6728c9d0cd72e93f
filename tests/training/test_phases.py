"""training.phases: group labels from path predicates, frozen groups (exactly zero updates, and
zero backbone gradients in LP), per-group learning-rate multipliers (one Adam step by hand), the
reward model frozen in RFT, and errors naming the config key."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_post.methods import progressive_recsys as prs
from jaxrl_post.models.recommender import RecommenderFM
from jaxrl_post.tasks import recommender_log as rl
from jaxrl_post.training import phases
from jaxrl_post.training.train_state import create_train_state, make_train_step

RULES = phases.GROUP_RULES.get("recommender")


def _world_and_model():
  world = rl.make_world(num_users=40, num_eval_users=8, num_items=12, dim=4, history_len=5,
                        slate=4)
  return world, RecommenderFM(world.num_items, dim=8, rngs=nnx.Rngs(0))


def _sft_batch(world):
  logs = rl.sample_logs(world, world.train_users[:6], np.random.default_rng(0))
  return {k: jnp.asarray(logs[k]) for k in ("history", "items", "level")}


def _groups(tree):
  """{group: [leaves]} of a parameter-shaped tree."""
  labels = phases.group_labels(tree, RULES)
  out = {}
  for label, leaf in zip(jax.tree.leaves(labels), jax.tree.leaves(tree), strict=True):
    out.setdefault(label, []).append(np.asarray(leaf))
  return out


def _phase_tx(phase, lr=1e-2):
  return phases.phase_optimizer(phases.RECSYS_PHASES[phase],
                                lambda p: phases.group_labels(p, RULES),
                                lambda m: optax.adam(lr * m), groups=prs.GROUPS,
                                key=f"config.phases.{phase}")


def test_labels_cover_every_parameter_by_path():
  _, model = _world_and_model()
  params = nnx.state(model, nnx.Param)
  labels = phases.group_labels(params, RULES)
  by_path = {phases.path_string(path): label
             for path, label in jax.tree_util.tree_flatten_with_path(labels)[0]}
  assert by_path["backbone/w_h"] == "backbone"
  assert by_path["encoder/w1"] == by_path["policy_head/w"] == "heads"
  assert by_path["reward_head/raw_thresholds"] == "reward"
  assert by_path["propensity_head/bias"] == "propensity"
  assert set(jax.tree.leaves(labels)) == set(prs.GROUPS)
  with pytest.raises(ValueError, match="parameter 'encoder/scale' is in no parameter group"):
    phases.group_labels(params, RULES[:1] + RULES[2:])


def _train_step(phase, loss_fn, batch):
  _, model = _world_and_model()
  graphdef = nnx.split(model)[0]
  tx = _phase_tx(phase)
  state = create_train_state(model, tx, jax.random.key(0))
  before = jax.tree.map(np.asarray, state.params)
  step = make_train_step(graphdef, loss_fn, tx)
  state, metrics = step(state, batch)
  return _groups(before), _groups(jax.tree.map(np.asarray, state.params)), metrics


def test_lp_backbone_gradients_and_updates_are_exactly_zero():
  world, model = _world_and_model()
  batch = _sft_batch(world)
  kw = dict(policy_weight=1.0, reward_weight=1.0, propensity_weight=1.0, ips_clip=50.0,
            slate=world.slate)
  graphdef, params = nnx.split(model, nnx.Param)

  def grads(stop):
    loss = prs.make_sft_loss(stop_backbone=stop, **kw)
    return _groups(jax.jit(jax.grad(lambda p: loss(nnx.merge(graphdef, p), batch)[0]))(params))

  lp, full = grads(True), grads(False)
  assert all(np.all(g == 0) for g in lp["backbone"])
  assert any(np.abs(g).max() > 0 for g in full["backbone"])  # the cut is what zeroes them
  for group in ("heads", "reward", "propensity"):
    assert any(np.abs(g).max() > 0 for g in lp[group]), group
  # The LP optimizer: backbone updates exactly zero even from non-zero (full) gradients.
  before, after, _ = _train_step("lp", prs.make_sft_loss(stop_backbone=False, **kw), batch)
  for a, b in zip(before["backbone"], after["backbone"], strict=True):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(before["heads"], after["heads"]))


def test_rft_freezes_the_reward_and_propensity_heads():
  world, _ = _world_and_model()
  batch = _sft_batch(world)
  rollout_batch = dict(
    history=batch["history"], candidates=jnp.tile(jnp.arange(6), (6, 1)),
    picks=jnp.tile(jnp.array([0, 2, 4]), (6, 1)), old_logp=jnp.full((6, 3), -np.log(6.0)),
    ref_logp=jnp.full((6, 6), -np.log(6.0)),
    adv=jnp.tile(jnp.array([1.0, -1.0, 0.0]), (6, 1)))
  loss = prs.make_rft_loss(temperature=1.0, epsilon=0.2, beta=0.1)
  before, after, _ = _train_step("rft", loss, rollout_batch)
  for group in ("reward", "propensity"):
    for a, b in zip(before[group], after[group], strict=True):
      np.testing.assert_array_equal(a, b)
  for group in ("backbone", "heads"):
    assert any(not np.array_equal(a, b) for a, b in zip(before[group], after[group])), group


def test_lr_multipliers_one_adam_step_by_hand():
  params = {"backbone": {"w": jnp.array([1.0, -2.0])}, "policy_head": {"w": jnp.array([0.5])},
            "reward_head": {"w": jnp.array([3.0])}}
  grads = {"backbone": {"w": jnp.array([0.3, -4.0])}, "policy_head": {"w": jnp.array([-2.0])},
           "reward_head": {"w": jnp.array([1.0])}}
  lr, eps = 1e-2, 1e-8
  tx = phases.phase_optimizer({"backbone": 0.1, "heads": 1.0}, phases.group_labels(params, RULES),
                              lambda m: optax.adam(lr * m, eps=eps), groups=prs.GROUPS)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  # Adam's first step: m̂ = g, v̂ = g², so u = −lr·m·g / (|g| + ε) = −lr·m·sign(g).
  np.testing.assert_allclose(updates["backbone"]["w"], [-1e-3, 1e-3], rtol=1e-4)  # f32 bias fix
  np.testing.assert_allclose(updates["policy_head"]["w"], [1e-2], rtol=1e-4)
  np.testing.assert_array_equal(updates["reward_head"]["w"], [0.0])  # reward: absent = frozen


def test_phase_errors_name_the_config_key():
  labels = {"backbone": {"w": "backbone"}}
  with pytest.raises(ValueError, match=r"config.phases.lp=.*freezes every parameter group"):
    phases.phase_optimizer({"backbone": 0.0}, labels, optax.sgd, groups=prs.GROUPS,
                           key="config.phases.lp")
  with pytest.raises(ValueError, match=r"config.phases.fft: unknown parameter group\(s\) "
                                       r"\['head'\]"):
    phases.phase_optimizer({"head": 1.0}, labels, optax.sgd, groups=prs.GROUPS,
                           key="config.phases.fft")
  with pytest.raises(ValueError, match=r"config.phases.rft.heads=-1.0"):
    phases.check_phase({"heads": -1.0}, prs.GROUPS, key="config.phases.rft")
