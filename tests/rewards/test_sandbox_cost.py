"""The sandbox bounds the cost per sample of a reward module, not only its output shape.

Hostile modules below grow arrays through every route the allow-list admits; each must be
rejected with a reason that names the measured value and the budget, before anything big is
materialised (the growth and cost checks run on abstract inputs; every test stays far below 1 GB
of real memory). The legitimate modules of the repository must still pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards import proposers as props
from jaxrl_post.rewards import sandbox as sb
from jaxrl_post.rl_control import envs, ppo

FEATURES = {"v": (), "height": (), "action": (8,), "pos": (3,)}


def _module(name, *lines):
  return f"def {name}(f):\n" + "".join(f"  {line}\n" for line in lines)


# The issue's module: double an (8,) feature 20 times (8M elements per sample), sum it back.
CONCAT_DOUBLING = _module("doubling", 'x = f["action"]',
                          *["x = jnp.concatenate([x, x], axis=-1)"] * 20,
                          "return jnp.sum(x, axis=-1)")
# `jnp.tile` / `jnp.repeat` by other means: 16 stacked copies per line, three lines.
STACK_TILE = _module("tiled", 'x = f["action"]', *["x = jnp.stack([x] * 16, axis=-1)"] * 3,
                     "return jnp.sum(x, axis=(1, 2, 3, 4))")
# `jnp.outer` by broadcasting: [B, 8, 1] * [B, 1, 8] -> [B, 8, 8], then again to [B, 8, 8, 8, 8].
OUTER_BROADCAST = _module(
    "outer", 'x = f["action"]',
    "o = jnp.stack([x], axis=-1) * jnp.stack([x], axis=-2)",
    "o = jnp.stack([jnp.stack([o], axis=-1)], axis=-1) * jnp.stack([jnp.stack([o], axis=1)], "
    "axis=1)",
    "return jnp.sum(o, axis=(1, 2, 3, 4))")
# A batch-independent constant of 16^5 = 1M elements built from allowed stacks.
BIG_CONSTANT = _module("constant", "c = jnp.stack([1.0] * 16)",
                       *["c = jnp.stack([c] * 16)"] * 4,
                       'return f["v"] * jnp.mean(c)')
# `jnp.dot` of two batched arrays contracts the feature axis and keeps *both* batch axes:
# [B, 8] . [B, 8, 8] -> [B, B, 8]. Harmless at the test-run's batch 4, 128 MB at batch 2048.
BATCH_SQUARED = _module("squared", 'x = f["action"]', "y = jnp.stack([x] * 8, axis=-1)",
                        "return jnp.sum(jnp.dot(x, y), axis=(1, 2))")
# A chain of 20 matmuls [B, 32] @ [32, 32] (unrolled: loops are not allowed): small arrays,
# 41k flops per sample.
MATMUL_CHAIN = _module("matmuls", 'x = f["action"]', "y = jnp.concatenate([x, x, x, x], axis=-1)",
                       "m = jnp.stack([jnp.mean(y, axis=0)] * 32)",
                       *["y = jnp.tanh(jnp.dot(y, m))"] * 20, "return jnp.sum(y, axis=-1)")

NOT_ADMITTED = {
    "tile": 'def m(f):\n  return jnp.sum(jnp.tile(f["action"], 4096), axis=-1)\n',
    "repeat": 'def m(f):\n  return jnp.sum(jnp.repeat(f["action"], 4096, axis=-1), axis=-1)\n',
    "outer": 'def m(f):\n  return jnp.sum(jnp.outer(f["v"], f["v"]), axis=-1)\n',
    "kron": 'def m(f):\n  return jnp.sum(jnp.kron(f["action"], f["action"]), axis=-1)\n',
    "einsum": 'def m(f):\n  return jnp.einsum("bi,bj->b", f["action"], f["action"])\n',
    "zeros": 'def m(f):\n  return f["v"] + jnp.sum(jnp.zeros((1 << 30,)))\n',
    "broadcast_to": 'def m(f):\n  return jnp.sum(jnp.broadcast_to(f["v"], (8, 8)))\n',
    "loop": 'def m(f):\n  x = f["v"]\n  for i in range(99):\n    x = x * x\n  return x\n',
}


def legit_modules():
  """The repository's legitimate modules: offline-proposer draws, test examples, a fused one."""
  info = props.TaskInfo(task="t", environment="e", feature_spec=FEATURES)
  proposer = props.OfflineProposer(props.OfflineProposerConfig(seed=0, min_modules=6,
                                                               max_modules=6))
  codes = {}
  for variant in range(6):
    plan = proposer.init_pool(info, "", iteration=1, variant=variant, num_variants=6)
    codes.update({op.name: op.code for op in plan.ops})
  codes["fwd"] = _module("fwd", 'return jnp.tanh(f["v"]) - 0.1 * jnp.sum(jnp.square(f["action"]), '
                                "axis=-1)")
  scalars = ", ".join(['f["v"]', 'f["height"]'] * 8)
  codes["stack16"] = _module("stack16", f"x = jnp.stack([{scalars}], axis=-1)",
                             "return jnp.sum(jnp.exp(-jnp.square(x)), axis=-1)")
  bodies = [c.split("return ")[1].strip() for c in list(codes.values())[:6]]
  codes["fused"] = _module("fused", *[f"t{i} = {b}" for i, b in enumerate(bodies)],
                           "return " + " + ".join(f"0.2 * t{i}" for i in range(len(bodies))))
  return codes


@pytest.fixture(scope="module")
def default_verdicts(tmp_path_factory):
  """One sandboxed child for every hostile and legitimate module, default budgets."""
  root = tmp_path_factory.mktemp("sandbox")
  legit = legit_modules()
  hostile = {"concat_doubling": CONCAT_DOUBLING, "stack_tile": STACK_TILE,
             "outer_broadcast": OUTER_BROADCAST, "big_constant": BIG_CONSTANT,
             "batch_squared": BATCH_SQUARED, "matmul_chain": MATMUL_CHAIN, **NOT_ADMITTED}
  codes = {**hostile, **legit}
  verdicts = sb.vet_modules(list(codes.values()), FEATURES,
                            config=sb.VetConfig(root=str(root)))
  by_name = dict(zip(codes, verdicts))
  return {n: by_name[n] for n in hostile}, {n: by_name[n] for n in legit}


@pytest.mark.parametrize("name", ["concat_doubling", "stack_tile", "outer_broadcast",
                                  "big_constant", "batch_squared"])
def test_growth_routes_rejected_by_the_jaxpr_walk(default_verdicts, name):
  v = default_verdicts[0][name]
  assert not v.ok and v.stage == "growth", v
  assert "elements per sample" in v.reason and "VetConfig.max_growth=64" in v.reason, v.reason
  assert v.cost["growth_elems_per_sample"] > 1024


def test_issue_module_names_its_size(default_verdicts):
  v = default_verdicts[0]["concat_doubling"]
  # The walk reports the largest intermediate of the traced jaxpr: the 20th doubling.
  assert f"{8 * 2**20} elements per sample" in v.reason, v.reason


def test_batch_squared_is_caught_at_the_trainer_batch_only(default_verdicts):
  v = default_verdicts[0]["batch_squared"]
  assert "at batch 2048" in v.reason and "float32[2048,2048,8]" in v.reason, v.reason


def test_flop_route_rejected_by_the_cost_check(default_verdicts):
  v = default_verdicts[0]["matmul_chain"]
  assert not v.ok and v.stage == "cost", v
  assert "flops per sample at batch 2048" in v.reason
  assert "VetConfig.max_flops_per_sample=16384" in v.reason, v.reason
  assert v.cost["growth_elems_per_sample"] <= 1024  # Small arrays: the growth walk passes it.


@pytest.mark.parametrize("name", sorted(NOT_ADMITTED))
def test_shape_constructors_are_not_admitted(default_verdicts, name):
  v = default_verdicts[0][name]
  assert not v.ok and v.stage == "validate", v


def test_legitimate_modules_pass_far_below_budget(default_verdicts):
  legit = default_verdicts[1]
  assert len(legit) >= 15
  for name, v in legit.items():
    assert v.ok, (name, v)
    # At least 100x below the byte and flop budgets, 64x below the growth limit.
    assert v.cost["bytes_per_sample"] * 100 <= sb.VetConfig().max_bytes_per_sample, (name, v)
    assert v.cost["flops_per_sample"] * 100 <= sb.VetConfig().max_flops_per_sample, (name, v)
    assert v.cost["growth_elems_per_sample"] * 64 <= sb.VetConfig().growth_floor, (name, v)


def test_cost_check_alone_catches_batch_squared_and_flops(sandbox_root):
  """With the growth limit switched off, XLA's cost analysis still rejects these routes.

  XLA fuses the big intermediates into their reductions ([B, B, 8] dot + sum, stacks + sum), so
  `memory_analysis()` sees few temp bytes: the flops give them away. That is why the jaxpr walk,
  which sees every intermediate before fusion, comes first.
  """
  cfg = sb.VetConfig(root=sandbox_root, max_growth=1 << 40, growth_floor=1 << 40)
  verdicts = sb.vet_modules([BATCH_SQUARED, MATMUL_CHAIN, STACK_TILE, OUTER_BROADCAST,
                             BIG_CONSTANT], FEATURES, config=cfg)
  squared, chain, stacked, outer, constant = verdicts
  for v in (squared, chain):
    assert not v.ok and v.stage == "cost" and "flops per sample" in v.reason, v
  assert squared.cost["flops_per_sample"] > 2 * 2048 * 8 * 8  # [B, 8] . [B, 8, 8], per sample.
  # XLA rewrites a sum over stacked copies into a multiply: compiled, the 32k-element route
  # costs nothing, so only the jaxpr walk (which bounds what the *traced* program holds) sees it.
  assert stacked.ok and stacked.cost["growth_elems_per_sample"] == 8 * 16**3, stacked
  # The broadcast outer products compile to ~8k flops per sample, under the budget: growth only.
  assert outer.ok and outer.cost["growth_elems_per_sample"] == 8**4, outer
  # The 1M-element constant is folded away at compile time.
  assert constant.ok and constant.cost["growth_elems_per_sample"] == 16**5, constant


def test_memory_budget_names_bytes(sandbox_root):
  cfg = sb.VetConfig(root=sandbox_root, max_bytes_per_sample=16.0)
  (v,) = sb.vet_modules([legit_modules()["fwd"]], FEATURES, config=cfg)
  assert not v.ok and v.stage == "cost", v
  assert "bytes per sample at batch 2048 (argument " in v.reason, v.reason
  assert "VetConfig.max_bytes_per_sample=16" in v.reason, v.reason


def test_budgets_are_config_values(sandbox_root):
  good = legit_modules()["fwd"]
  cfg = sb.VetConfig(root=sandbox_root, max_flops_per_sample=4.0)
  (v,) = sb.vet_modules([good], FEATURES, config=cfg)
  assert not v.ok and v.stage == "cost" and "max_flops_per_sample=4" in v.reason, v


def test_vet_config_checks_its_values():
  with pytest.raises(ValueError, match="eval_batch"):
    sb.VetConfig(eval_batch=0)
  with pytest.raises(ValueError, match="max_bytes_per_sample"):
    sb.VetConfig(max_bytes_per_sample=0)


def test_verdict_json_round_trip_keeps_cost():
  v = sb.Verdict(False, "cost: too much", "cost", {"flops_per_sample": 1e6})
  assert sb.Verdict.from_json(v.to_json()) == v
  assert sb.Verdict.from_json({"ok": True}) == sb.Verdict(True)


# ---------------------------------------------------------------------------------------------
# In the trainer: a failing module is dropped and counted, the run goes on.
# ---------------------------------------------------------------------------------------------

GOOD_POLE = mp.ModuleSpec(name="upright", description="", code=_module(
    "upright", 'return -jnp.abs(f["theta"])'))
# jnp.cross needs a last axis of 2 or 3: fine at a batch of 3, raises at the trainer's batch.
RAISES = mp.ModuleSpec(name="crossed", description="", code=_module(
    "crossed", 'return jnp.cross(f["x"], f["theta"])'))
NAN_LOG = mp.ModuleSpec(name="log_x", description="", code=_module(
    "log_x", 'return jnp.log(f["x"])'))  # NaN whenever the cart is left of centre.


def test_reward_fn_replaces_a_raising_module_by_zeros():
  spec = {"x": (), "theta": ()}
  reward_fn = mp.build_reward_fn([GOOD_POLE, RAISES], spec)
  feats = {"x": jnp.arange(4.0), "theta": jnp.array([0.1, -0.2, 0.3, 0.0])}
  out = jax.jit(reward_fn)(feats, jnp.array([1.0, 1.0]))
  np.testing.assert_allclose(out.reward, [-0.1, -0.2, -0.3, 0.0], rtol=1e-6)
  assert out.failed.tolist() == [0, 1] and out.terms[1].tolist() == [0.0] * 4
  assert list(reward_fn.failures) == ["crossed"] and "ValueError" in reward_fn.failures["crossed"]
  with pytest.raises(ValueError):
    mp.build_reward_fn([RAISES], spec, guard=False)(feats, jnp.array([1.0]))


def test_ppo_drops_failing_modules_and_counts_them():
  task = envs.make_task("CartPole-v1")
  cfg = ppo.PPOConfig(num_envs=4, num_steps=16, total_timesteps=128, update_epochs=1,
                      num_minibatches=1)
  reward_fn = mp.build_reward_fn([GOOD_POLE, RAISES, NAN_LOG], task.feature_spec)
  m = ppo.train_seeds(cfg, task, [0], reward_fn=reward_fn, weights=np.ones(3, np.float32),
                      fast_compile=True)
  assert m["module_dropped"].shape == (1, 2, 3)
  assert m["module_dropped"][0, -1].tolist() == [0, 1, 1]  # Raised at trace time / went NaN.
  assert m["pool/dropped_modules"][0].tolist()[-1] == 2
  for key in ("learn_reward", "loss", "fitness"):
    assert np.all(np.isfinite(m[key])), key
  assert m["module_nonfinite"][0, :, 2].sum() > 0 and "crossed" in reward_fn.failures
