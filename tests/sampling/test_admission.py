"""MISA / MISA-T formulas, the ledger, the §2.3 decision procedure and the scheduler."""

import json

import numpy as np
import pytest

from jaxrl_post.sampling import admission as adm

CLASSES = ("agent", "rlhf", "rlvr")
PRIOR_FP = {"agent": 30.0, "rlhf": 8.0, "rlvr": 30.0}
PRIOR_RES = {"agent": 20.0, "rlhf": 10.0, "rlvr": 60.0}


def _ledger(**kw):
  return adm.Ledger(CLASSES, PRIOR_FP, PRIOR_RES, **kw)


def test_quotas_golden_and_sum_to_capacity():
  # S = N k̄ = [2·10, 1·40] = [20, 40] → M = 120 · [1/3, 2/3]; K = [⌊40/10⌋, ⌊80/40⌋].
  np.testing.assert_allclose(adm.space_quotas([2, 1], [10, 40], 120), [40, 80])
  # R = N k̄ T̂ = [2·10·4, 1·40·1] = [80, 40] → M = 120 · [2/3, 1/3] = [80, 40].
  np.testing.assert_allclose(adm.time_quotas([2, 1], [10, 40], [4, 1], 120), [80, 40])
  np.testing.assert_array_equal(adm.class_caps([40, 80], [10, 40]), [4, 2])
  rng = np.random.default_rng(0)
  for _ in range(50):
    n, fp, t = rng.integers(0, 9, 4), rng.uniform(0.5, 50, 4), rng.uniform(0.1, 9, 4)
    c = float(rng.uniform(1, 1000))
    for quotas in (adm.space_quotas(n, fp, c), adm.time_quotas(n, fp, t, c)):
      assert quotas.sum() == pytest.approx(c)
      caps = adm.class_caps(quotas, fp)
      assert caps.min() >= 1  # every class can always run one session
      # Beyond the floor of 1, the caps' reserved blocks fit the quota.
      assert np.all((caps == 1) | (caps * fp <= quotas + 1e-6))
  np.testing.assert_allclose(adm.space_quotas([0, 0], [1, 5], 10), [5, 5])  # no demand: split
  # Tiny quotas still give one session each.
  np.testing.assert_array_equal(adm.class_caps([0.1, 0.0], [10, 40]), [1, 1])


def test_bad_inputs_name_the_argument():
  with pytest.raises(ValueError, match="footprint"):
    adm.space_quotas([1, 1], [0, 1], 10)
  with pytest.raises(ValueError, match="capacity"):
    adm.time_quotas([1], [1], [1], 0)
  with pytest.raises(ValueError, match="residency"):
    adm.time_quotas([1], [1], [-1], 5)
  with pytest.raises(ValueError, match="config.rollout.admission='fifo'"):
    adm.get_policy("fifo")
  with pytest.raises(ValueError, match="prior_footprint"):
    adm.Ledger(CLASSES, {"agent": 1.0}, PRIOR_RES)
  with pytest.raises(ValueError, match="hit_len"):
    adm.placement_cost(4, np.array([5.0]), np.zeros(1), np.ones(1))


def test_tv_pressure_and_placement_golden():
  # ½(|0.5 − 0.25| + |0.5 − 0.75|) = 0.25; counts are normalised; nothing consumed → 0.
  assert adm.mixture_tv([1, 1], [1, 3]) == pytest.approx(0.25)
  assert adm.mixture_tv([2, 6], [0.25, 0.75]) == 0.0
  assert adm.mixture_tv([0, 0], [0.5, 0.5]) == 0.0
  # The paper's numbers (rounded shares): ½(2.7 + 0.2 + 2.6)/99.9·100 ≈ 2.75 pp.
  assert adm.mixture_tv([45.9, 33.3, 20.8], [48.6, 33.1, 18.2]) == pytest.approx(
    0.5 * (abs(.459 - .486 / .999) + abs(.333 - .331 / .999) + abs(.208 - .182 / .999)))
  np.testing.assert_allclose(adm.overload_pressure([0.9, 0.5], [0.7, 0.6]), [0.2, 0.0])
  # ĉ = d + (L − H)/μ: [1 + 10/2, 2 + 2/2].
  np.testing.assert_allclose(adm.placement_cost(10, np.array([0, 8]), np.array([1.0, 2.0]),
                                                np.array([2.0, 2.0])), [6.0, 3.0])


def test_global_cap_rule_cuts_only_on_confirmed_degradation():
  rule = adm.CapRule(confirm_epochs=3, cut_factor=0.5, recover=0.5, min_cap=2, max_cap=100)
  cap, bad = 40.0, 0
  for _ in range(2):  # two degraded epochs: not yet confirmed, the cap holds
    cap, bad = adm.update_global_cap(cap, 40.0, 0.3, bad, rule)
  assert (cap, bad) == (40.0, 2)
  cap, bad = adm.update_global_cap(cap, 40.0, 0.3, bad, rule)
  assert (cap, bad) == (20.0, 0)
  cap, bad = adm.update_global_cap(cap, 40.0, 0.0, bad, rule)  # healthy: halfway back
  assert (cap, bad) == (30.0, 0)
  assert adm.update_global_cap(3.0, 1.0, 0.0, 0, rule)[0] == 2.0  # clipped to min_cap


def _view(ledger, cap=100, in_flight=0, capacity=120.0):
  return adm.View(ledger, capacity, in_flight, cap)


def test_continuations_are_never_held_and_hold_keeps_demand():
  for name in ("session", "misa", "misa_t"):
    policy = adm.get_policy(name)
    ledger = _ledger()
    for s in range(3):
      ledger.admit(s, "agent", pending=False)
    # Global cap reached: new sessions are held, continuations still run.
    view = _view(ledger, cap=3)
    assert policy.admit(view, "agent", continuation=True)
    assert not policy.admit(view, "rlhf", continuation=False)
    ledger.hold(10, "rlhf")
    assert ledger.demand().tolist() == [3, 1, 0]  # the held request still counts in N_b
    assert 10 in ledger.held["rlhf"]
  # Class headroom: with the agent class at its cap, another agent is held, rlhf admitted.
  ledger = _ledger()
  ledger.admit(0, "agent", pending=False)
  policy = adm.get_policy("misa")
  caps = policy.caps(_view(ledger, capacity=40.0))  # M = 40 · [1·30, 0, 0]/30 → K_agent = 1
  assert caps == {"agent": 1, "rlhf": 1, "rlvr": 1}
  assert not policy.admit(_view(ledger, capacity=40.0), "agent", False, caps)
  assert policy.admit(_view(ledger, capacity=40.0), "rlhf", False, caps)
  # Static concurrency caps requests, continuations included.
  static = adm.get_policy("static")
  assert not static.admit(_view(ledger, cap=4, in_flight=4), "agent", continuation=True)
  assert static.admit(_view(ledger, cap=4, in_flight=3), "agent", continuation=False)


def test_misa_t_gives_long_residency_classes_more_sessions():
  ledger = _ledger()
  for s, cls in enumerate(["rlhf"] * 4 + ["rlvr"] * 4):
    ledger.hold(s, cls)
  view = _view(ledger, capacity=240.0)
  space = adm.get_policy("misa").caps(view)
  timed = adm.get_policy("misa_t").caps(view)
  # Space: M ∝ N k̄ → K = C N_b / Σ N k̄ = 240·4/152 ≈ 6.3 for both classes.
  assert space["rlhf"] == space["rlvr"] == 6
  # Time: R = [0, 4·8·10, 4·30·60] → K_rlvr = ⌊240·7200/7520/30⌋ = 7, K_rlhf = max(1, ·) = 1.
  assert timed == {"agent": 1, "rlhf": 1, "rlvr": 7}


def test_ledger_estimates_and_state_roundtrip():
  ledger = _ledger(window=4, footprint_quantile=1.0)
  assert ledger.estimate("rlvr") == (30.0, 60.0)  # priors
  ledger.admit(1, "rlvr")
  ledger.confirm(1)
  assert 1 in ledger.active["rlvr"]
  ledger.complete(1, footprint=12.0, residency=5.0)
  for fp in (3.0, 9.0, 1.0, 2.0):
    ledger.observe_footprint("rlvr", fp)
  assert ledger.estimate("rlvr") == (9.0, 5.0)  # the max of the last 4 (12 left the window)
  copy = _ledger(window=4, footprint_quantile=1.0)
  copy.load_state_dict(json.loads(json.dumps(ledger.state_dict())))
  assert copy.state_dict() == ledger.state_dict()
  with pytest.raises(ValueError, match="neither active nor pending"):
    ledger.complete(99)


class _Data:
  """Releases `n` records per call, cycling through classes in the pattern given."""

  def __init__(self, pattern, n=4):
    self.pattern, self.n, self.position = pattern, n, 0

  def __call__(self):
    out = [{"id": self.position + i, "cls": self.pattern[(self.position + i) % len(self.pattern)]}
           for i in range(self.n)]
    self.position += self.n
    return out


def _scheduler(policy, capacity=64.0, **kw):
  return adm.RolloutScheduler(
    policy, classes=CLASSES, target={"agent": 0.5, "rlhf": 0.25, "rlvr": 0.25}, batch_size=4,
    capacity=capacity, classify=lambda r: r["cls"],
    footprint_of=lambda r: {"agent": 16, "rlhf": 4, "rlvr": 16}[r["cls"]],
    prior_footprint=PRIOR_FP, prior_residency=PRIOR_RES, **kw)


def test_scheduler_static_is_fifo_and_holds_keep_the_backlog():
  data = _Data(["agent", "agent", "rlhf", "rlvr"])
  static = _scheduler("static")
  batch = static.next_batch(data)
  assert [r["id"] for r in batch] == [0, 1, 2, 3]  # today's path: the drawn batch as is
  assert static.backlog == [] and static.metrics()["admission/forced"] == 0

  # MISA with a budget of 20 blocks: caps K = max(1, ⌊20·N_b k̄_b/Σ N k̄ / k̄_b⌋) = 1 per class
  # (S = [2·16, 4, 16]); the second agent is HELD, a second release adds only more held
  # sessions (the caps stay 1), and the slot left is forced to the oldest held session.
  data = _Data(["agent", "agent", "rlhf", "rlvr"])
  misa = _scheduler("misa", capacity=20.0, max_releases=2)
  batch = misa.next_batch(data)
  assert [r["id"] for r in batch] == [0, 2, 3, 1]
  metrics = misa.metrics()
  assert metrics["admission/forced"] == 1 and metrics["admission/releases"] == 2
  assert metrics["admission/held_agent"] == 2 and metrics["admission/cap_agent"] == 1
  # HOLD keeps the backlog: the held sessions wait, in release order, with their demand.
  assert [s.id for s in misa.backlog] == [4, 5, 6, 7]
  assert misa.ledger.held["agent"] == [4, 5]
  assert misa.ledger.demand().tolist() == [2 + 2, 1 + 1, 1 + 1]  # live + held
  misa.complete(misa.batch_ids(), residencies=[1.0] * 4)
  misa.consume([r["cls"] for r in batch])
  state = json.loads(json.dumps(misa.state_dict()))
  batch2 = misa.next_batch(data)
  assert [r["id"] for r in batch2] == [4, 6, 7, 5]  # held ones first, oldest first
  # Conservation: every released session is in a batch or still in the backlog / ledger.
  assert len(batch) + len(batch2) + len(misa.backlog) == misa.next_id == 16  # 4 releases
  assert misa.ledger.live() == 4  # the second batch, not completed yet
  # Restored from its JSON state, the scheduler makes the same next decision.
  again = _scheduler("misa", capacity=20.0, max_releases=2)
  again.load_state_dict(state)
  data2 = _Data(["agent", "agent", "rlhf", "rlvr"])
  data2.position = 8
  assert again.next_batch(data2) == batch2
  tv = misa.metrics()["admission/tv_consumed_target"]
  # Consumed 2 agent, 1 rlhf, 1 rlvr = the target 0.5 / 0.25 / 0.25.
  assert tv == pytest.approx(adm.mixture_tv(misa.consumed, [0.5, 0.25, 0.25])) == 0.0
