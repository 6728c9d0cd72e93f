"""scripts/mlref_retrain.py: fresh seeds, the tests' statistics, a tiny retrain end to end."""

import json
from pathlib import Path

import numpy as np
import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.rewards import module_pool as mp

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "mlref_retrain.py")


def _config(**kw):
  import sys
  sys.path.insert(0, str(ROOT / "configs"))
  try:
    import mlref_gymnax
  finally:
    sys.path.pop(0)
  c = mlref_gymnax.get_config("runlocal")
  c.retrain_seeds = 2
  c.update(kw)
  return c


def test_welch_and_mann_whitney_golden():
  a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0])
  c = SCRIPT.compare(a, b)
  # Welch by hand: s_a² = 5/3, s_b² = 4; t = (2.5 − 4) / sqrt(5/12 + 4/3) = −1.1339.
  se = np.sqrt(np.var(a, ddof=1) / 4 + np.var(b, ddof=1) / 3)
  assert c["t"] == pytest.approx((2.5 - 4.0) / se) and c["t"] == pytest.approx(-1.1339, abs=1e-4)
  # Welch–Satterthwaite df = (5/12 + 4/3)² / ((5/12)²/3 + (4/3)²/2) = 3.4188 → p from t(df).
  from scipy import stats
  df = (5 / 12 + 4 / 3) ** 2 / ((5 / 12) ** 2 / 3 + (4 / 3) ** 2 / 2)
  assert c["p_welch"] == pytest.approx(2 * stats.t.sf(abs(c["t"]), df))
  # U of a: pairs (a_i > b_j) + ½ ties: 1 > none, 2 = 2 (½), 3 > 2, 4 > 2 and 4 = 4 (½) → 3.
  assert c["u"] == pytest.approx(3.0)
  assert 0 < c["p_mwu"] <= 1
  with pytest.raises(ValueError, match="≥ 2 samples"):
    SCRIPT.compare([1.0], b)


def test_retrain_seeds_are_fresh():
  assert SCRIPT.retrain_seeds(_config(retrain_seeds=5)) == [900_000 + i for i in range(5)]
  with pytest.raises(ValueError, match="retrain_seed_base=1000 reuses"):
    SCRIPT.retrain_seeds(_config(retrain_seed_base=1000, pipelines=3))


def test_retrain_tiny_workdir(tmp_path):
  # A finished pipeline's state with R* = 0.7 alive + 0.3 upright, as evolve saves it.
  alive = mp.ModuleSpec(name="alive_bonus", description="survive",
                        code='def alive_bonus(f):\n  return f["alive"]\n')
  upright = mp.ModuleSpec(name="upright", description="small angle",
                          code='def upright(f):\n  return -jnp.square(f["theta"])\n')
  state = mp.PoolState(iteration=2, pool=mp.Pool((alive, upright)), best_score=20.0,
                       best_reward={"iteration": 2, "variant": 0, "score": 20.0,
                                    "modules": [alive.to_json(), upright.to_json()],
                                    "weights": [0.7, 0.3]})
  mp.save_state(str(tmp_path / "mlref" / "p0"), state)
  cfg = _config()
  recs = SCRIPT.retrain(cfg, str(tmp_path))
  assert [(r["method"], r["pipeline"]) for r in recs] == [("env_reward", -1), ("mlref", 0)]
  for r in recs:
    assert r["seeds"] == [900_000, 900_001] and len(r["per_seed_score"]) == 2
    assert all(s >= 8 for s in r["per_seed_score"])  # True CartPole returns (≥ 9 steps).
  assert recs[1]["evolution_best"] == 20.0 and recs[1]["modules"] == ["alive_bonus@1",
                                                                       "upright@1"]
  lines = (tmp_path / "retrain.jsonl").read_text().splitlines()
  assert len(lines) == 2
  # Resumes: nothing is retrained twice.
  assert SCRIPT.retrain(cfg, str(tmp_path)) == [json.loads(x) for x in lines]
  text = SCRIPT.table(recs)
  assert "MLREF (pool + hybrid credit) vs PPO on the env reward" in text
  assert "| PPO on the env reward | 2 |" in text
  SCRIPT.plot(recs, str(tmp_path / "retrain.png"))
  assert (tmp_path / "retrain.png").stat().st_size > 0


def test_clip_shares_counts_modules_beyond_the_clip(tmp_path):
  # |x| / 1e-4 exceeds the clip (10) wherever |x| > 1e-3: nearly always; alive ≤ 1 never.
  wide = mp.ModuleSpec(name="x_track", description="", code='def x_track(f):\n'
                       '  return -jnp.abs(f["x"]) / 0.0001\n')
  alive = mp.ModuleSpec(name="alive_bonus", description="",
                        code='def alive_bonus(f):\n  return f["alive"]\n')
  state = mp.PoolState(iteration=1, best_score=1.0, best_reward={
      "iteration": 1, "variant": 0, "score": 1.0, "modules": [wide.to_json(), alive.to_json()],
      "weights": [0.5, 0.5]})
  mp.save_state(str(tmp_path / "mlref" / "p0"), state)
  shares = SCRIPT.clip_shares(_config(), str(tmp_path), num_envs=4, num_steps=16)
  assert list(shares) == ["mlref"] and len(shares["mlref"]) == 1
  x_share, alive_share = shares["mlref"][0]
  assert x_share > 0.9 and alive_share == 0.0
