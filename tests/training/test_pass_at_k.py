"""`training.evaluation.pass_at_k` and `outcome_metrics`: golden values from enumeration."""

import itertools

import numpy as np
import pytest
from scipy.special import comb

from jaxrl_post.training.evaluation import outcome_metrics, pass_at_k, standard_error


def _brute_force(n: int, c: int, k: int) -> float:
  """The fraction of k-subsets of n samples (the first c correct) holding a correct one."""
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_enumeration_over_subsets(n):
  for k in range(1, n + 1):
    c = np.arange(n + 1)
    got = pass_at_k(np.full(n + 1, n), c, k)
    want = [_brute_force(n, int(ci), k) for ci in c]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_pass_at_k_equals_binomial_formula_and_is_stable_for_large_n():
  n = np.array([10, 50, 100, 200, 200])
  c = np.array([3, 10, 1, 0, 150])
  for k in (1, 5, 10):
    want = 1.0 - comb(n - c, k, exact=False) / comb(n, k, exact=False)
    np.testing.assert_allclose(pass_at_k(n, c, k), want, rtol=1e-12, atol=1e-14)
  # C(2000, 1000) overflows float64; the product form does not.
  exact = 1 - comb(1500, 1000, exact=True) / comb(2000, 1000, exact=True)
  got = pass_at_k(2000, 500, 1000)
  assert np.isfinite(got) and abs(float(got) - float(exact)) < 1e-12


def test_pass_at_1_is_the_fraction_correct_and_pass_at_n_is_any_correct():
  n, c = np.array([4, 4, 4, 6]), np.array([0, 1, 3, 6])
  np.testing.assert_allclose(pass_at_k(n, c, 1), c / n)
  np.testing.assert_array_equal(pass_at_k(n, c, 4), (c > 0).astype(float))


def test_pass_at_k_errors_name_k_and_n():
  with pytest.raises(ValueError, match=r"k=5, n=4"):
    pass_at_k([4, 8], [1, 1], 5)
  with pytest.raises(ValueError, match="k >= 1"):
    pass_at_k(4, 1, 0)
  with pytest.raises(ValueError, match="0 <= c <= n"):
    pass_at_k(4, 5, 1)


def test_outcome_metrics_values_and_standard_errors():
  greedy = np.array([1, 0, 1, np.nan])
  samples = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, np.nan, 1, 1], [0, 1, 0, 0]])
  m = outcome_metrics(greedy, samples, pass_ks=(1, 2, 4), greedy_format=np.array([1, 1, 0, 1]))
  assert m["accuracy"] == pytest.approx(2 / 3)
  assert m["accuracy_se"] == pytest.approx(np.std([1, 0, 1], ddof=1) / np.sqrt(3))
  assert m["format"] == pytest.approx(0.75)
  rates = np.array([0.5, 0.0, 1.0, 0.25])  # The third problem: 3 scored samples, all correct.
  assert m["sample_accuracy"] == pytest.approx(rates.mean())
  assert m["sample_accuracy_se"] == pytest.approx(rates.std(ddof=1) / 2)
  pass2 = np.array([_brute_force(4, 2, 2), 0.0, 1.0, _brute_force(4, 1, 2)])
  assert m["pass_at_2"] == pytest.approx(pass2.mean())
  assert m["pass_at_2_se"] == pytest.approx(standard_error(pass2))
  assert m["pass_at_1"] == pytest.approx(m["sample_accuracy"])
  # The problem with 3 scored samples cannot give pass@4: it is left out.
  assert m["pass_at_4"] == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="k=8, n=4"):
    outcome_metrics(greedy, samples, pass_ks=(8,))
  assert set(outcome_metrics(greedy)) == {"accuracy", "accuracy_se"}
  assert m["format_se"] == pytest.approx(np.std([1, 1, 0, 1], ddof=1) / 2)
