"""The serving simulator: deterministic, conserves sessions, and over-admission collapses hits."""

import dataclasses

from jaxrl_post.sampling import serving_sim as sim

SMALL = sim.SimConfig(instances=2, ticks=250, batch=32)


def test_deterministic_and_conserves_sessions():
  for policy in ("static", "session", "misa", "misa_t"):
    a = sim.simulate(SMALL, policy, seed=3)
    assert a == sim.simulate(SMALL, policy, seed=3)
    # Every released session completed or is still in the ledger (live or held).
    assert a.released == a.completed + a.live + a.held
    assert 0.0 <= a.hit_rate <= 1.0 and 0.0 <= a.tv <= 1.0


def test_over_admitting_static_baseline_collapses_the_hit_rate():
  low = sim.simulate(dataclasses.replace(SMALL, cap=8), "static", seed=0)
  high = sim.simulate(dataclasses.replace(SMALL, cap=64), "static", seed=0)
  assert low.hit_rate > 0.6 and high.hit_rate < 0.3
