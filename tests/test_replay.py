"""Headroom-Drift Replay (arXiv 2609.03941): group statistics, FIFO buffer, selection, Prop. 2."""

import collections
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post import replay
from jaxrl_post.replay import (
  REPLAY_SELECTORS,
  ReplayBuffer,
  buffer_age,
  candidate_order,
  group_drift,
  group_headroom,
  headroom_bound_holds,
  ingress_mask,
  refresh_headroom,
  replay_add,
  replay_gather,
  replay_init,
  select_replay,
)


def test_doctests():
  assert doctest.testmod(replay, raise_on_error=True).attempted >= 20


def _groups(seed=0, m=6, g=3, t=5, p=4, spread=0.3):
  """M random groups, ragged responses, garbage (NaN / −inf) on padding."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, t + 1, size=(m, g))
  lengths[0] = t  # at least one full group
  mask = np.arange(t) < lengths[..., None]
  gen = np.log(rng.uniform(0.02, 0.98, size=(m, g, t))).astype(np.float32)
  cur = np.minimum(gen + spread * rng.standard_normal(gen.shape), 0.0).astype(np.float32)
  adv = rng.standard_normal((m, g)).astype(np.float32)
  adv[1, 0] = 0.0  # a zero-advantage response has no headroom
  gen = np.where(mask, gen, -np.inf).astype(np.float32)
  cur = np.where(mask, cur, np.nan).astype(np.float32)
  return dict(mask=mask, gen=gen, cur=cur, adv=adv,
              tokens=rng.integers(0, 100, size=(m, g, t)).astype(np.int32),
              prompt_tokens=rng.integers(0, 100, size=(m, p)).astype(np.int32),
              prompt_mask=np.arange(p)[None] >= rng.integers(0, p, size=(m, 1)))


def _np_headroom(logp, adv, mask):
  out = []
  for m in range(logp.shape[0]):
    total, n = 0.0, 0
    for i in range(logp.shape[1]):
      for j in range(logp.shape[2]):
        if not mask[m, i, j]:
          continue
        p = np.exp(np.float64(logp[m, i, j]))
        total += (1 - p) if adv[m, i] > 0 else (p if adv[m, i] < 0 else 0.0)
        n += 1
    out.append(total / max(n, 1))
  return np.array(out)


def _np_drift(cur, gen, mask):
  out = []
  for m in range(cur.shape[0]):
    d = [(np.float64(cur[m, i, j]) - gen[m, i, j]) ** 2
         for i in range(cur.shape[1]) for j in range(cur.shape[2]) if mask[m, i, j]]
    out.append(sum(d) / max(len(d), 1))
  return np.array(out)


# ---------------------------------------------------------------------------------------------
# Group statistics.
# ---------------------------------------------------------------------------------------------


def test_headroom_and_drift_golden_by_hand():
  # One group, A = (+1, −1, 0): tokens 0.2 0.6 | 0.5 [pad] | 0.3 0.3.
  p = np.array([[[0.2, 0.6], [0.5, 0.1], [0.3, 0.3]]], np.float32)
  mask = np.array([[[1, 1], [1, 0], [1, 1]]], bool)
  adv = np.array([[1.0, -1.0, 0.0]], np.float32)
  # (0.8 + 0.4 + 0.5 + 0 + 0) / 5 = 0.34; the padded 0.1 is ignored.
  np.testing.assert_allclose(group_headroom(np.log(p), adv, mask), [0.34], rtol=1e-6)
  gen = np.log(p)
  cur = gen + np.array([[[0.1, -0.2], [0.3, 9.0], [0.0, 0.0]]], np.float32)
  # (0.01 + 0.04 + 0.09) / 5 = 0.028 (L2 mean; the L1 mean would be 0.12).
  np.testing.assert_allclose(group_drift(cur, gen, mask), [0.028], rtol=1e-5)
  # Empty group: 0, not NaN.
  np.testing.assert_array_equal(group_drift(cur, gen, np.zeros_like(mask)), [0.0])
  np.testing.assert_array_equal(group_headroom(cur, adv, np.zeros_like(mask)), [0.0])


def test_headroom_drift_match_numpy_under_jit():
  r = _groups(seed=1)
  h = jax.jit(group_headroom)(r["cur"], r["adv"], r["mask"])
  d = jax.jit(group_drift)(r["cur"], r["gen"], r["mask"])
  np.testing.assert_allclose(h, _np_headroom(r["cur"], r["adv"], r["mask"]), rtol=1e-5)
  np.testing.assert_allclose(d, _np_drift(r["cur"], r["gen"], r["mask"]), rtol=1e-5, atol=1e-8)
  assert np.isfinite(np.asarray(h)).all() and np.isfinite(np.asarray(d)).all()
  assert np.asarray(d)[0] > 0


def test_ingress_mask():
  r = np.array([[1, 0, 1], [1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.2], [0.95, 0.3, np.nan],
                [0.92, 0.3, 0.1]], np.float32)
  assert ingress_mask(r).tolist() == [True, False, False, True, False, True]
  assert ingress_mask(r, threshold=0.9).tolist() == [True, False, False, False, False, True]
  with pytest.raises(ValueError, match="rewards"):
    ingress_mask(np.ones(3))


def test_group_stat_errors():
  r = _groups()
  with pytest.raises(ValueError, match="mask"):
    group_headroom(r["cur"], r["adv"], r["mask"][:, :, :-1])
  with pytest.raises(ValueError, match="adv"):
    group_headroom(r["cur"], r["adv"][:, :-1], r["mask"])
  with pytest.raises(ValueError, match="logp_gen"):
    group_drift(r["cur"], r["gen"][:-1], r["mask"])
  with pytest.raises(ValueError, match="logp_cur"):
    group_drift(r["cur"][0], r["gen"][0], r["mask"][0])


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  r = _groups(seed=2, m=16)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def stats(cur, gen, adv, mask):
    return (group_headroom(cur, adv, mask), group_drift(cur, gen, mask),
            headroom_bound_holds(cur, gen, adv, mask))

  args = [r[k] for k in ("cur", "gen", "adv", "mask")]
  single = stats(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  out = stats(*sharded)
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(out, single):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Prop. 2.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_prop2_bound_holds_on_random_policies(seed):
  rng = np.random.default_rng(seed)
  m, g, t = 64, 4, 6
  # Groups from near-identical to far-apart policies, sparse and dense masks.
  ref = np.log(rng.uniform(1e-3, 1.0, size=(m, g, t)))
  scale = np.exp(rng.uniform(-6, 1, size=(m, 1, 1)))
  cur = np.minimum(ref + scale * rng.standard_normal(ref.shape), 0.0)
  adv = rng.standard_normal((m, g)) * (rng.uniform(size=(m, g)) > 0.2)
  mask = rng.uniform(size=(m, g, t)) < rng.uniform(0.1, 1.0, size=(m, 1, 1))
  ok = headroom_bound_holds(cur.astype(np.float32), ref.astype(np.float32),
                            adv.astype(np.float32), mask)
  assert np.asarray(ok).all()
  # Independent check in float64 and that the bound is not vacuous: the gap is a sizeable
  # fraction of sqrt(drift) for some groups.
  gap = np.abs(_np_headroom(cur, adv, mask) - _np_headroom(ref, adv, mask))
  root = np.sqrt(_np_drift(cur, ref, mask))
  assert (gap <= root + 1e-12).all()
  assert (gap > 0.3 * root).any()


def test_prop2_check_can_fail():
  # The bound needs log-probs ≤ 0 (probabilities): with "log-probs" of 2.0 and 1.9 the
  # headroom moves by e^2 − e^1.9 ≈ 0.70 while sqrt(drift) = 0.1.
  cur, ref = np.full((1, 1, 1), 2.0, np.float32), np.full((1, 1, 1), 1.9, np.float32)
  assert headroom_bound_holds(cur, ref, np.ones((1, 1)), np.ones((1, 1, 1))).tolist() == [False]


# ---------------------------------------------------------------------------------------------
# The buffer.
# ---------------------------------------------------------------------------------------------


def test_replay_init_errors_name_the_argument():
  for bad in (0, -1, 2.0, None):
    with pytest.raises(ValueError, match="capacity"):
      replay_init(capacity=bad, group_size=2, length=3, prompt_length=4)
  with pytest.raises(ValueError, match="group_size"):
    replay_init(capacity=2, group_size=0, length=3, prompt_length=4)
  with pytest.raises(ValueError, match="prompt_length"):
    replay_init(capacity=2, group_size=2, length=3, prompt_length=0)


def _add(buf, r, admit, step, ids):
  return replay_add(buf, r["prompt_tokens"], r["prompt_mask"], r["tokens"], r["mask"], r["gen"],
                    r["adv"], admit, step=step, prompt_id=ids)


def test_fifo_order_and_eviction_match_a_deque():
  cap, m = 4, 4
  buf = replay_init(capacity=cap, group_size=3, length=5, prompt_length=4)
  rng = np.random.default_rng(3)
  model = collections.deque(maxlen=cap)  # (prompt_id, step), oldest first
  next_id = 0
  for step in range(8):
    r = _groups(seed=10 + step, m=m)
    admit = rng.uniform(size=m) < 0.7
    if step == 5:
      admit[:] = False  # nothing admitted: the buffer is unchanged
    ids = np.arange(next_id, next_id + m, dtype=np.int32)
    next_id += m
    buf = _add(buf, r, admit, step, ids)
    for k in np.flatnonzero(admit):
      model.append((int(ids[k]), step))
    assert int(buf.count) == len(model)
    age = np.asarray(buffer_age(buf))
    valid = np.asarray(buf.valid)
    assert valid.sum() == len(model)
    # Oldest first = descending age.
    order = np.argsort(-np.where(valid, age, -1))[:len(model)]
    ids_now, steps_now = np.asarray(buf.prompt_id), np.asarray(buf.insert_step)
    got = [(int(ids_now[s]), int(steps_now[s])) for s in order]
    assert got == list(model)
  # Stored content is the admitted group itself, padding of logp_gen stored as 0.
  slot = (int(buf.next_slot) - 1) % cap
  last_id = int(np.asarray(buf.prompt_id)[slot])
  r = _groups(seed=10 + 7, m=m)
  k = last_id - (next_id - m)
  np.testing.assert_array_equal(buf.tokens[slot], r["tokens"][k])
  np.testing.assert_array_equal(buf.prompt_tokens[slot], r["prompt_tokens"][k])
  np.testing.assert_array_equal(buf.logp_gen[slot], np.where(r["mask"][k], r["gen"][k], 0.0))
  np.testing.assert_allclose(buf.headroom[slot],
                             _np_headroom(r["gen"][k:k + 1], r["adv"][k:k + 1],
                                          r["mask"][k:k + 1])[0], rtol=1e-5)


def test_more_than_capacity_admitted_at_once_keeps_the_last():
  buf = replay_init(capacity=3, group_size=3, length=5, prompt_length=4)
  r = _groups(m=6)
  admit = np.array([1, 1, 0, 1, 1, 1], bool)
  buf = _add(buf, r, admit, 4, np.arange(6, dtype=np.int32))
  assert sorted(np.asarray(buf.prompt_id).tolist()) == [3, 4, 5]
  assert int(buf.count) == 3 and int(buf.next_slot) == 2  # 5 admitted, (0 + 5) mod 3
  assert np.asarray(buf.insert_step).tolist() == [4, 4, 4]
  assert np.asarray(buffer_age(buf))[np.asarray(buf.prompt_id) == 5].tolist() == [0]


def test_replay_add_shape_errors():
  buf = replay_init(capacity=3, group_size=3, length=5, prompt_length=4)
  r = _groups(m=2)
  with pytest.raises(ValueError, match="tokens"):
    replay_add(buf, r["prompt_tokens"], r["prompt_mask"], r["tokens"][:, :2], r["mask"],
               r["gen"], r["adv"], np.ones(2, bool), step=0)
  with pytest.raises(ValueError, match="prompt_tokens"):
    replay_add(buf, r["prompt_tokens"][:, :3], r["prompt_mask"], r["tokens"], r["mask"],
               r["gen"], r["adv"], np.ones(2, bool), step=0)
  with pytest.raises(ValueError, match="adv"):
    replay_add(buf, r["prompt_tokens"], r["prompt_mask"], r["tokens"], r["mask"], r["gen"],
               r["adv"][:1], np.ones(2, bool), step=0)


def test_buffer_checkpoints_exactly(tmp_path):
  buf = replay_init(capacity=4, group_size=3, length=5, prompt_length=4)
  buf = _add(buf, _groups(m=4), np.array([1, 0, 1, 0], bool), 2, np.arange(4, dtype=np.int32))
  leaves, treedef = jax.tree.flatten(buf)
  assert len(leaves) == len(ReplayBuffer._fields)
  assert all(isinstance(x, jax.Array) for x in leaves)  # no Python lists / ints
  np.savez(tmp_path / "buf.npz", *[np.asarray(x) for x in leaves])
  with np.load(tmp_path / "buf.npz") as f:
    restored = jax.tree.unflatten(treedef, [jnp.asarray(f[f"arr_{i}"])
                                            for i in range(len(leaves))])
  for a, b in zip(jax.tree.leaves(restored), leaves):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
  # The restored buffer continues exactly like the original.
  r = _groups(seed=5, m=4)
  admit = np.array([1, 1, 1, 0], bool)
  one = _add(buf, r, admit, 3, np.arange(4, dtype=np.int32))
  two = _add(restored, r, admit, 3, np.arange(4, dtype=np.int32))
  jax.tree.map(np.testing.assert_array_equal, one, two)


# ---------------------------------------------------------------------------------------------
# Selection.
# ---------------------------------------------------------------------------------------------


def _np_walk(headroom, drift, valid, tau, budget):
  """The paper's walk: descending headroom, accept drift ≤ τ, stop at budget accepted."""
  order = sorted([i for i in range(len(headroom)) if valid[i]], key=lambda i: (-headroom[i], i))
  out = []
  for i in order:
    if len(out) == budget:
      break
    if drift[i] <= tau:
      out.append(i)
  return out


@pytest.mark.parametrize("seed,budget,tau", [(0, 3, 0.5), (1, 8, 0.5), (2, 4, 0.05),
                                             (3, 20, 10.0)])
def test_select_replay_matches_the_walk(seed, budget, tau):
  rng = np.random.default_rng(seed)
  c = 12
  headroom = rng.uniform(size=c).astype(np.float32)
  headroom[3] = headroom[7]  # a tie: the lower slot first
  drift = rng.exponential(0.4, size=c).astype(np.float32)
  valid = rng.uniform(size=c) < 0.8
  sel = jax.jit(select_replay, static_argnames="budget")(headroom, drift, valid, budget=budget,
                                                         tau=tau)
  want = _np_walk(headroom, drift, valid, tau, budget)
  n = len(want)
  assert sel.indices.shape == (budget,)
  assert np.asarray(sel.accepted).tolist() == [True] * n + [False] * (budget - n)
  assert np.asarray(sel.indices)[:n].tolist() == want


def test_select_replay_stop_rules_by_hand():
  headroom = np.array([0.5, 0.9, 0.1, 0.7, 0.8], np.float32)
  drift = np.array([0.0, 0.2, 0.0, 0.0, 0.0], np.float32)
  valid = np.array([1, 1, 1, 1, 0], bool)
  # Walk 1 (drift too high: skipped), 4 (invalid), 3, 0: stops at budget 2.
  sel = select_replay(headroom, drift, valid, budget=2, tau=0.1)
  assert sel.indices.tolist() == [3, 0] and sel.accepted.tolist() == [True, True]
  # Exhausted buffer: fewer than budget accepted; drift exactly τ is accepted.
  sel = select_replay(headroom, drift, valid, budget=5, tau=0.2)
  assert sel.indices.tolist()[:4] == [1, 3, 0, 2]
  assert sel.accepted.tolist() == [True] * 4 + [False]
  with pytest.raises(ValueError, match="budget"):
    select_replay(headroom, drift, valid, budget=0)
  with pytest.raises(ValueError, match="drift"):
    select_replay(headroom, drift[:3], valid, budget=2)


def test_candidates_then_select_equals_full_select():
  rng = np.random.default_rng(7)
  c, budget = 16, 4
  headroom = rng.uniform(size=c).astype(np.float32)
  drift = rng.exponential(0.1, size=c).astype(np.float32)
  valid = rng.uniform(size=c) < 0.75
  full = select_replay(headroom, drift, valid, budget=budget, tau=0.1)
  cand = candidate_order(headroom, valid, max_candidates=c)
  # The trainer scores only the candidates (here all of them) and selects among them.
  idx = np.asarray(cand.indices)
  sel = select_replay(headroom[idx], drift[idx], np.asarray(cand.accepted), budget=budget,
                      tau=0.1)
  np.testing.assert_array_equal(np.asarray(full.accepted), np.asarray(sel.accepted))
  n = int(np.sum(full.accepted))
  np.testing.assert_array_equal(idx[np.asarray(sel.indices)][:n], np.asarray(full.indices)[:n])
  # A short candidate list is the head of the same order.
  short = candidate_order(headroom, valid, max_candidates=3)
  np.testing.assert_array_equal(short.indices, idx[:3])


def test_registry_selectors():
  assert REPLAY_SELECTORS.names() == ["headroom_drift", "headroom_only", "naive"]
  headroom = np.array([0.9, 0.1, 0.8, 0.7], np.float32)
  drift = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
  valid = np.ones(4, bool)
  age = np.array([3, 0, 2, 1], np.int32)
  kw = dict(budget=2, tau=0.5, age=age)
  assert REPLAY_SELECTORS.get("headroom_drift")(headroom, drift, valid, **kw).indices.tolist() \
      == [2, 3]
  assert REPLAY_SELECTORS.get("headroom_only")(headroom, drift, valid, **kw).indices.tolist() \
      == [0, 2]
  assert REPLAY_SELECTORS.get("naive")(headroom, drift, valid, **kw).indices.tolist() == [1, 3]
  with pytest.raises(ValueError, match="age"):
    REPLAY_SELECTORS.get("naive")(headroom, drift, valid, budget=2)
  with pytest.raises(KeyError, match="headroom_drift"):
    REPLAY_SELECTORS.get("fifo")


def test_select_then_add_then_refresh():
  """One step: select from the buffer, gather, refresh headroom, THEN add the fresh groups."""
  # The same shapes as the FIFO test (one compilation of replay_add).
  buf = replay_init(capacity=4, group_size=3, length=5, prompt_length=4)
  old = _groups(seed=8, m=4)
  buf = _add(buf, old, np.ones(4, bool), 0, np.arange(4, dtype=np.int32))
  drift = np.array([0.0, 1.0, 0.0, 0.0], np.float32)
  sel = select_replay(buf.headroom, drift, buf.valid, budget=2, tau=0.5)
  groups = replay_gather(buf, sel.indices)
  want = _np_walk(np.asarray(buf.headroom), drift, np.ones(4, bool), 0.5, 2)
  assert np.asarray(groups.prompt_id).tolist() == want
  np.testing.assert_array_equal(groups.tokens, old["tokens"][want])
  np.testing.assert_array_equal(groups.adv, old["adv"][want])
  buf = refresh_headroom(buf, sel.indices, np.array([0.123, 0.456], np.float32), sel.accepted)
  np.testing.assert_allclose(np.asarray(buf.headroom)[want], [0.123, 0.456])
  # Fresh groups go in after selection: they evict the two oldest (ids 0 and 1), whatever was
  # replayed, and are not part of this step's replay.
  fresh = _groups(seed=9, m=4)
  buf = _add(buf, fresh, np.array([1, 1, 0, 0], bool), 1, np.array([10, 11, 12, 13], np.int32))
  assert sorted(np.asarray(buf.prompt_id).tolist()) == [2, 3, 10, 11]
  assert not set(np.asarray(groups.prompt_id).tolist()) & {10, 11}
  np.testing.assert_array_equal(np.asarray(buf.insert_step)[np.asarray(buf.prompt_id) >= 10],
                                [1, 1])
