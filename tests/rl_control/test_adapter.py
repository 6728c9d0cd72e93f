"""The evolve adapter returns curves of the right shapes; baseline proposers make valid plans."""

import numpy as np

from jaxrl_post.rewards import module_code
from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards.evolution import RewardCandidate
from jaxrl_post.rewards.proposers import OfflineProposer, OfflineProposerConfig
from jaxrl_post.rl_control import adapter, envs, ppo

TASK = envs.make_task("CartPole-v1")
ALIVE = mp.ModuleSpec(name="alive_bonus", description="survive",
                      code='def alive_bonus(f):\n  return f["alive"]\n')
UPRIGHT = mp.ModuleSpec(name="upright", description="small angle",
                        code='def upright(f):\n  a = jnp.square(f["theta"])\n  return -a\n')
IDLE = mp.ModuleSpec(name="idle", description="unselected", code='def idle(f):\n  return f["x"]\n')


def test_train_fn_shapes_and_curves():
  cfg = ppo.PPOConfig(num_envs=4, num_steps=32, total_timesteps=512, update_epochs=1,
                      num_minibatches=1)
  records = []
  train_fn = adapter.make_train_fn(TASK, cfg, seeds=[0, 1], score_window=3, fast_compile=True,
                                   on_result=lambda c, r: records.append(r))
  cand = RewardCandidate(1, 0, (ALIVE, UPRIGHT, IDLE), np.array([0.7, 0.3, 0.0], np.float32),
                         ("alive_bonus", "upright"), dict(TASK.feature_spec))
  res = train_fn(cand)
  u = cfg.num_updates
  assert res.performance.shape == (u,)
  assert set(res.module_curves) == {"alive_bonus", "upright", "idle"}
  assert all(c.shape == (u,) for c in res.module_curves.values())
  assert np.isfinite(res.score)
  np.testing.assert_allclose(res.score, res.performance[-3:].mean(), rtol=1e-6)
  # Fitness is the true return (≥ 9 steps per CartPole episode), not the shaped reward.
  assert np.all(res.performance >= 8)
  # alive is 1 except on the terminal step; upright ≤ 0; idle still gets a curve.
  assert np.all((res.module_curves["alive_bonus"] > 0.8) & (res.module_curves["alive_bonus"] <= 1))
  assert np.all(res.module_curves["upright"] <= 0)
  assert records[0]["per_seed_score"].shape == (2,)


def test_combine_modules_is_allowed_code_and_sums_terms():
  code = adapter.combine_modules([ALIVE.code, UPRIGHT.code], [0.5, 2.0])
  module_code.validate_module_code(code, TASK.feature_spec.keys())
  fused = mp.ModuleSpec(name="reward", description="", code=code)
  feats = {k: np.full((3,), 0.1, np.float32) for k in TASK.feature_spec}
  out = mp.build_reward_fn([fused], TASK.feature_spec)(feats, np.ones(1, np.float32))
  np.testing.assert_allclose(out.reward, 0.5 * 0.1 - 2.0 * 0.01, rtol=1e-5)


def _apply(plan):
  pool, _, rejected = mp.apply_plan(mp.Pool((ALIVE, UPRIGHT)), plan,
                                    accept=lambda code: (True, "", ""), iteration=2, variant=0)
  return pool, rejected


def test_baseline_proposers():
  info = TASK.task_info()
  base = OfflineProposer(OfflineProposerConfig(seed=3))
  mono = adapter.MonolithicProposer(base)
  init = mono.init_pool(info, "", iteration=1, variant=0, num_variants=1)
  assert [o.op for o in init.ops] == ["ADD"] and init.ops[0].name == "reward"
  module_code.validate_module_code(init.ops[0].code, info.feature_spec.keys())
  pool = mp.Pool((mp.ModuleSpec(name="reward", description="", code=init.ops[0].code),))
  plan = mono.improve_pool(info, pool, "", mp.PoolState(), iteration=2, variant=0,
                           num_variants=1)
  assert [o.op for o in plan.ops] == ["REWRITE"]
  assert mono.propose_weights(info, pool, "", iteration=2, variant=0, k=5) == {"reward": 1.0}

  nopool = adapter.NoPoolProposer(base)
  plan = nopool.improve_pool(info, mp.Pool((ALIVE, UPRIGHT)), "", mp.PoolState(), iteration=2,
                             variant=0, num_variants=1)
  pool, rejected = _apply(plan)
  assert not rejected
  assert "alive_bonus" not in pool.names and "upright" not in pool.names and len(pool) >= 4

  c = adapter.llm_weights_only(mp.CreditConfig())
  assert c.w_llm == 1.0 and c.gamma == 0.0


def test_feature_statistics_cartpole():
  import jax

  stats = adapter.feature_statistics(TASK, jax.random.PRNGKey(0), num_envs=8, num_steps=64)
  assert set(stats) == set(TASK.feature_spec)
  assert all(np.isfinite(m) and np.isfinite(s) and s >= 0 for m, s in stats.values())
  assert 0.0 < stats["theta"][1] < 0.2  # Terminates at |theta| > 0.21.
  assert 0.8 < stats["alive"][0] <= 1.0  # Random episodes last ~20 steps.
  assert abs(stats["push"][0]) < 0.2 and 0.9 < stats["push"][1] <= 1.0  # Uniform ±1.


def test_loop_task_info_carries_stats_for_the_proposer():
  info = adapter.loop_task_info(TASK, num_envs=4, num_steps=32)
  assert set(info.feature_stats) == set(TASK.feature_spec)
  assert info.feature_spec == dict(TASK.feature_spec) and info.task == TASK.task
  assert adapter.loop_task_info(TASK, num_steps=0).feature_stats == {}
  # The offline proposer's modules on these scales are valid and finite on real features.
  plan = OfflineProposer(OfflineProposerConfig(seed=0)).init_pool(info, "", iteration=1,
                                                                  variant=0, num_variants=1)
  mods = [mp.ModuleSpec(name=o.name, description=o.description, code=o.code) for o in plan.ops]
  for m in mods:
    module_code.validate_module_code(m.code, TASK.feature_spec.keys())
  feats = {k: np.full((5,), v[0], np.float32) for k, v in info.feature_stats.items()}
  out = mp.build_reward_fn(mods, TASK.feature_spec)(feats, np.ones(len(mods), np.float32))
  assert np.all(np.isfinite(out.reward))
