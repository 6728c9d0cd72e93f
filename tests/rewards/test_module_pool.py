"""Module specs, the composed reward, credit / selection, plans, merge + rollback, persistence."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.rewards import module_pool as mp

FEATURES = {"v": (), "a": (2,)}
M_SPEED = mp.ModuleSpec(name="speed", description="2v",
                        code='def speed(f):\n  return 2.0 * f["v"]\n')
M_EFFORT = mp.ModuleSpec(name="effort", description="-|a|^2",
                         code='def effort(f):\n  return -jnp.sum(jnp.square(f["a"]), axis=-1)\n')
M_LOG = mp.ModuleSpec(name="logv", description="log v",
                      code='def logv(f):\n  return jnp.log(f["v"])\n')


def _ok(code):
  return True, "", "ok"


def _pool(*mods, **stats):
  return mp.Pool(tuple(mods), {k: mp.ModuleStats(**v) for k, v in stats.items()})


def test_module_spec_json_roundtrip_and_lineage():
  m2 = M_SPEED.derive(code='def speed(f):\n  return 3.0 * f["v"]\n', description=None,
                      origin="MODIFY", iteration=2)
  assert (m2.version, m2.lineage, m2.origin, m2.uid) == (2, ("speed@1",), "MODIFY", "speed@2")
  m3 = m2.derive(code=m2.code, description="new", origin="REWRITE", iteration=3)
  assert m3.lineage == ("speed@1", "speed@2") and m3.description == "new"
  assert mp.ModuleSpec.from_json(json.loads(json.dumps(m3.to_json()))) == m3
  with pytest.raises(ValueError):
    mp.ModuleSpec(name="Bad Name", description="", code="")


def test_composed_reward_golden_under_jit_and_no_retrace():
  traces = []
  reward_fn = mp.build_reward_fn([M_SPEED, M_EFFORT], FEATURES)

  @jax.jit
  def step(features, weights):
    traces.append(1)
    return reward_fn(features, weights)

  feats = {"v": jnp.array([1.0, -0.5]), "a": jnp.array([[1.0, 1.0], [0.0, 3.0]]),
           "unused": jnp.zeros(2)}
  out = step(feats, jnp.array([0.5, 0.25]))
  # m_speed = [2, -1]; m_effort = [-2, -9]; R = 0.5 m_speed + 0.25 m_effort = [0.5, -2.75]
  np.testing.assert_allclose(out.reward, [0.5, -2.75])
  np.testing.assert_allclose(out.terms, [[2.0, -1.0], [-2.0, -9.0]])
  assert out.nonfinite.tolist() == [0, 0]
  out = step(feats, jnp.array([1.0, 0.0]))  # New weights: same compiled function.
  np.testing.assert_allclose(out.reward, [2.0, -1.0])
  assert len(traces) == 1
  np.testing.assert_allclose(mp.compose_reward(out.terms, jnp.array([1.0, 1.0])), [0.0, -10.0])


def test_composed_reward_batch_shapes_and_vmap():
  reward_fn = mp.build_reward_fn([M_SPEED, M_EFFORT], FEATURES)
  feats = {"v": jnp.ones((3, 4)), "a": jnp.ones((3, 4, 2))}  # [envs, steps, *shape]
  out = jax.jit(reward_fn)(feats, jnp.array([1.0, 1.0]))
  assert out.reward.shape == (3, 4) and out.terms.shape == (2, 3, 4)
  np.testing.assert_allclose(out.reward, np.zeros((3, 4)))  # 2·1 - (1 + 1)
  vm = jax.vmap(reward_fn, in_axes=(0, None))(feats, jnp.array([1.0, 0.0]))
  np.testing.assert_allclose(vm.reward, 2 * np.ones((3, 4)))


def test_nonfinite_module_outputs_are_neutralised():
  reward_fn = mp.build_reward_fn([M_SPEED, M_LOG], FEATURES, clip=5.0)
  feats = {"v": jnp.array([4.0, -1.0, 0.0]), "a": jnp.zeros((3, 2))}
  out = jax.jit(reward_fn)(feats, jnp.array([1.0, 1.0]))
  # log(4) = 1.386294; log(-1) = nan -> 0; log(0) = -inf -> 0; speed 8 clipped to 5.
  np.testing.assert_allclose(out.terms[1], [np.log(4.0), 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out.reward, [5.0 + np.log(4.0), -2.0, 0.0], rtol=1e-6)
  assert out.nonfinite.tolist() == [0, 2]


def test_llm_credit_ema_golden():
  pool = _pool(M_SPEED, M_EFFORT, M_LOG, speed=dict(ema_llm=0.5))
  pool = mp.update_llm_credit(pool, {"speed": 3.0, "effort": 1.0, "ghost": 7.0}, alpha=0.7)
  # c_LLM = [0.75, 0.25, 0] -> 0.7 c + 0.3 c~ = [0.525 + 0.15, 0.175, 0]
  assert [pool.stats[n].ema_llm for n in pool.names] == pytest.approx([0.675, 0.175, 0.0])


def test_corr_credit_update_only_for_modules_with_curves():
  pool = _pool(M_SPEED, M_EFFORT, M_LOG, logv=dict(ema_corr=0.4))
  t = np.arange(40, dtype=np.float32)
  cfg = mp.CreditConfig(smooth_window=1, diff_window=1, max_lag=0, w_raw=1.0, alpha=0.7)
  pool = mp.update_corr_credit(pool, t, {"speed": 2 * t, "effort": -t}, config=cfg)
  # speed: corr +1 -> 0.7; effort: corr -1 -> -0.7; logv: no curve -> unchanged 0.4.
  assert [pool.stats[n].ema_corr for n in pool.names] == pytest.approx([0.7, -0.7, 0.4],
                                                                       abs=1e-5)


def test_select_modules_weights_are_scores_and_counts_update():
  pool = _pool(M_SPEED, M_EFFORT, M_LOG, speed=dict(ema_llm=0.6, ema_corr=0.5, count=1),
               effort=dict(ema_llm=0.4, ema_corr=0.0, count=1), logv=dict(count=0))
  cfg = mp.CreditConfig(k=2, tau=0.25, w_llm=0.5, gamma=0.2)
  sel, new_pool = mp.select_modules(pool, config=cfg)
  # s_llm = [0.6, 0.4, 0]; s_corr = softmax([0, -2, -2]) = [1, e^-2, e^-2] / 1.270671
  #   = [0.786986, 0.106507, 0.106507]; s = (s_llm + s_corr) / 2 = [0.693493, 0.253254, 0.053254]
  # U = 2: bonus = 0.2 sqrt(ln 3) / (n + 1) = 0.209629 / [2, 2, 1]
  #   -> u = [0.798308, 0.358069, 0.262883] -> top-2 = speed, effort.
  assert sel.names == ("speed", "effort")
  np.testing.assert_allclose(sel.weights, [0.693493, 0.253254], atol=2e-6)  # s_k, not u_k
  assert sel.ucb["logv"] == pytest.approx(0.262883, abs=2e-6)
  assert [new_pool.stats[n].count for n in new_pool.names] == [2, 2, 0]
  sel_n, _ = mp.select_modules(pool, config=mp.CreditConfig(k=2, renormalize=True))
  assert float(sel_n.weights.sum()) == pytest.approx(1.0)


def test_apply_plan_ops_versions_and_rejections():
  pool = _pool(M_SPEED, M_EFFORT, speed=dict(ema_corr=0.3, count=4))
  new_speed = 'def speed(f):\n  return 3.0 * f["v"]\n'
  plan = mp.ImprovePlan(rationale="r", ops=(
      mp.PlanOp(op="MODIFY", name="speed", description="faster", code=new_speed),
      mp.PlanOp(op="remove", name="effort"),
      mp.PlanOp(op="ADD", name="logv", description="log", code=M_LOG.code),
      mp.PlanOp(op="ADD", name="bad", description="x", code="import os"),
      mp.PlanOp(op="REWRITE", name="ghost", description="x", code=M_LOG.code),
      mp.PlanOp(op="ADD", name="speed", description="dup", code=new_speed),
      mp.PlanOp(op="DELETE", name="ghost"),
  ))
  accept = lambda code: (False, "nope", "test-run") if "import" in code else _ok(code)
  new, applied, rejected = mp.apply_plan(pool, plan, accept=accept, iteration=3, variant=1)
  assert new.names == ("speed", "logv")
  assert new.get("speed").version == 2 and new.get("speed").origin == "MODIFY"
  assert new.stats["speed"].count == 4  # Credit state follows the name across versions.
  assert new.stats["logv"] == mp.ModuleStats()
  assert [o.op for o in applied] == ["MODIFY", "DELETE", "ADD"]
  assert [(r.name, r.op) for r in rejected] == [("bad", "ADD"), ("ghost", "REWRITE"),
                                                ("speed", "ADD"), ("ghost", "DELETE")]
  assert rejected[0].reason == "nope" and rejected[0].stage == "test-run"
  # A rejected MODIFY keeps the old version; a full pool refuses ADDs.
  plan2 = mp.ImprovePlan(ops=(mp.PlanOp(op="MODIFY", name="speed", code="import os"),
                              mp.PlanOp(op="ADD", name="more", code=M_LOG.code)))
  kept, _, rej = mp.apply_plan(new, plan2, accept=accept, iteration=4, variant=0, max_modules=2)
  assert kept.get("speed").version == 2 and "more" not in kept and len(rej) == 2
  with pytest.raises(ValueError):
    mp.PlanOp(op="EXPLODE", name="x")


def _variant(*mods_and_counts):
  mods = tuple(m for m, _ in mods_and_counts)
  return mp.Pool(mods, {m.name: mp.ModuleStats(count=c) for m, c in mods_and_counts})


def test_merge_union_best_wins_collisions():
  prev = _variant((M_SPEED, 0))
  speed_v2 = M_SPEED.derive(code=M_SPEED.code, description="v2", origin="MODIFY", iteration=2)
  v0 = _variant((M_SPEED, 1), (M_EFFORT, 1))
  v1 = _variant((speed_v2, 5), (M_LOG, 5))
  v2 = _variant((M_LOG, 9))
  res = mp.merge_variants(prev, [v0, v1, v2], [1.0, 1.05, 0.5], best_score=1.1, threshold=0.1)
  # Survivors: within 0.1 of 1.1 -> v1 (1.05) then v0 (1.0); v2 (0.5) discarded.
  assert res.survivors == (1, 0) and not res.rolled_back
  assert [d[0] for d in res.discarded] == [2]
  assert [m.uid for m in res.pool.modules] == ["speed@2", "logv@1", "effort@1"]
  assert res.pool.stats["speed"].count == 5 and res.pool.stats["effort"].count == 1
  assert res.owner == {"speed": 1, "logv": 1, "effort": 0}


def test_merge_rollback_first_round_nan_and_relative():
  prev = _variant((M_SPEED, 3))
  v0, v1 = _variant((M_EFFORT, 1)), _variant((M_LOG, 1))
  res = mp.merge_variants(prev, [v0, v1], [0.2, 0.1], best_score=1.0, threshold=0.1)
  assert res.rolled_back and res.pool is prev and res.survivors == ()
  # First round (no S_best yet): every finite variant survives; NaN is discarded.
  res = mp.merge_variants(prev, [v0, v1], [-5.0, float("nan")], best_score=None, threshold=0.1)
  assert res.survivors == (0,) and res.pool.names == ("effort",)
  # Relative margin: 0.1 * |10| = 1 -> 9.5 survives, 8.9 does not.
  res = mp.merge_variants(prev, [v0, v1], [9.5, 8.9], best_score=10.0, threshold=0.1,
                          relative=True)
  assert res.survivors == (0,)


def test_state_persistence_roundtrip(tmp_path):
  assert mp.load_state(tmp_path) is None
  state = mp.PoolState(
      iteration=2, pool=_pool(M_SPEED, M_EFFORT, speed=dict(ema_llm=0.25, ema_corr=-0.5, count=3)),
      best_score=1.5, best_reward={"iteration": 2, "variant": 0, "score": 1.5,
                                   "modules": [M_SPEED.to_json()], "weights": [0.7]},
      history=[{"iteration": 1, "kind": "new_best", "variants": []}],
      failures=[mp.FailureRecord(iteration=2, variant=1, kind="train_error", detail="boom")],
      rejected=[mp.RejectedModule(iteration=2, variant=0, name="x", op="ADD", reason="r",
                                  stage="validate", code="import os")],
      vet_cache={"k": {"ok": True, "reason": "", "stage": "ok"}}, reflection="text",
      extra={"seed": np.int64(3)})
  path = mp.save_state(tmp_path, state)
  assert os.listdir(tmp_path) == [mp.STATE_FILENAME]  # Atomic write: no temp files left.
  loaded = mp.load_state(tmp_path)
  assert loaded.to_json() == json.loads(open(path).read())
  assert loaded.pool == state.pool and loaded.failures == state.failures
  assert loaded.rejected == state.rejected and loaded.best_score == 1.5
  # The composed reward of a restored pool is the same function.
  feats = {"v": jnp.array([1.0]), "a": jnp.ones((1, 2))}
  f0 = mp.build_reward_fn(state.pool.modules, FEATURES)(feats, jnp.array([1.0, 1.0]))
  f1 = mp.build_reward_fn(loaded.pool.modules, FEATURES)(feats, jnp.array([1.0, 1.0]))
  np.testing.assert_array_equal(f0.reward, f1.reward)
  with open(path, "w") as f:
    json.dump({"format": 999}, f)
  with pytest.raises(ValueError):
    mp.load_state(tmp_path)
