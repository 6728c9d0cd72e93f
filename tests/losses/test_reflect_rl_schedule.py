"""ReflectRL's reflective → direct schedule (arXiv 2608.03972, Eq. 7) against hand values."""

import doctest
import math

import jax
import numpy as np
import pytest

from jaxrl_post import losses
from jaxrl_post.losses import reflect_rl


def test_doctests():
  assert doctest.testmod(reflect_rl, raise_on_error=True).attempted >= 8


def _cosine(t, warm, trans, p_h, p_l):
  tau = min(max((t - warm) / trans, 0.0), 1.0)
  return p_l + (p_h - p_l) / 2 * (1 + math.cos(math.pi * tau))


@pytest.mark.parametrize("p_h,p_l,warm,trans", [(0.5, 0.0, 0, 60), (1.0, 0.25, 10, 30)])
def test_cosine_kernel_matches_eq7(p_h, p_l, warm, trans):
  for t in range(0, 101, 7):
    got = float(losses.reflective_fraction(t, total_steps=100, warmup_steps=warm,
                                           transition_steps=trans, p_high=p_h, p_low=p_l))
    assert got == pytest.approx(_cosine(t, warm, trans, p_h, p_l), abs=1e-6)


def test_default_schedule_and_counts():
  # PROPOSAL defaults: p_h = 0.5, p_l = 0, transition over the first 60 % of the steps.
  counts = [losses.reflective_count(8, losses.reflective_fraction(t, total_steps=100))
            for t in (0, 15, 30, 45, 59, 60, 100)]
  # g = 0.5, 0.427, 0.25, 0.073, 0.0002, 0, 0 → K = round(8 g) half up.
  assert counts == [4, 3, 2, 1, 0, 0, 0]
  # Monotone non-increasing over a run: reflective rollouts are only ever removed.
  ks = [losses.reflective_count(8, losses.reflective_fraction(t, total_steps=50))
        for t in range(51)]
  assert all(a >= b for a, b in zip(ks, ks[1:]))


def test_kernels_and_jit():
  assert set(losses.REFLECT_KERNELS.names()) >= {"cosine", "linear", "step"}
  fn = jax.jit(lambda t: losses.reflective_fraction(t, total_steps=20, kernel="linear"))
  np.testing.assert_allclose([fn(t) for t in (0, 6, 12)], [0.5, 0.25, 0.0], atol=1e-6)
  assert float(losses.reflective_fraction(5, total_steps=20, kernel="step")) == 0.5
  assert float(losses.reflective_fraction(6, total_steps=20, kernel="step")) == 0.0
  # No transition: direct only right after the warm-up.
  assert float(losses.reflective_fraction(3, total_steps=9, warmup_steps=3,
                                          transition_steps=0)) == 0.5
  assert float(losses.reflective_fraction(4, total_steps=9, warmup_steps=3,
                                          transition_steps=0)) == 0.0


def test_rows_in_shuffled_groups():
  gid = np.array([2, 0, 2, 1, 0, 2, 1, 0])
  rows = losses.reflective_rows(gid, 2)
  assert rows.tolist() == [True, True, True, True, True, False, True, False]
  assert not losses.reflective_rows(gid, 0).any()


def test_truncate_negative():
  tokens = list(range(1000))
  out = losses.truncate_negative(tokens, 300, head=256)
  assert out[:256] == tokens[:256] and out[256:] == tokens[-44:] and len(out) == 300
  assert losses.truncate_negative(tokens, 100, head=256) == tokens[:100]


def test_bad_input():
  with pytest.raises(KeyError, match="cosin"):
    losses.reflective_fraction(0, total_steps=10, kernel="cosin")
  with pytest.raises(ValueError, match="p_high"):
    losses.reflective_fraction(0, total_steps=10, p_high=1.5)
  with pytest.raises(ValueError, match="budget"):
    losses.truncate_negative([1], -1)
