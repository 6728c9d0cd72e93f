"""PertMind's reward (§4.2): golden values, ordering, λ checks, w_conf, zero-variance groups."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.rewards import pertmind


def _record(answer="Up", pathway_labels=("Up", "uncertain", "Down"), w_conf=0.8):
  meta = dict(pathway_labels=list(pathway_labels), w_conf=w_conf)
  return {"answer": answer, "meta": json.dumps(meta)}


def test_components_golden():
  record = _record()
  assert pertmind.components(record, "1:Up 2:No 3:Up ans:Up") == (1.0, 0.5, 1.0, 1.0, "Up")
  assert pertmind.components(record, " 1:Up 2:Up 3:Down ans:Down\n") == (0.0, 1.0, 1.0, 1.0,
                                                                       "Down")
  # Malformed but one terminal answer: gene scored, no format, no pathway credit.
  assert pertmind.components(record, "maybe ans:Up") == (1.0, 0.0, 1.0, 0.0, "Up")
  # Two answers: none taken.
  assert pertmind.components(record, "ans:Up ans:Down").label is None
  # Every pathway uncertain: m_pw = 0.
  none = _record(pathway_labels=("uncertain",) * 3)
  assert pertmind.components(none, "1:Up 2:Up 3:Up ans:Up")[1:3] == (0.0, 0.0)
  for garbage in ("", "x" * 5000, "ans:Upward"):
    assert pertmind.components(record, garbage).gene == 0.0


def test_reward_golden_and_a_wrong_gene_answer_never_outscores_a_right_one():
  r = pertmind.pertmind_reward(np.array([1.0, 0.0]), np.array([0.5, 1.0]), np.array([1.0, 1.0]),
                               np.array([1.0, 1.0]), lambda_pw=0.3, lambda_fmt=0.1)
  np.testing.assert_allclose(np.asarray(r), [1.0 + 0.15 + 0.1, 0.3 + 0.1], rtol=1e-6)
  grid = np.array(list(itertools.product([0.0, 1.0], [0.0, 1 / 3, 0.5, 1.0], [0.0, 1.0],
                                         [0.0, 1.0])))
  for lam_pw, lam_fmt in [(0.3, 0.1), (0.0, 0.1), (0.89, 0.1), (0.5, 0.49)]:
    r = np.asarray(pertmind.pertmind_reward(*grid.T, lambda_pw=lam_pw, lambda_fmt=lam_fmt))
    assert r[grid[:, 0] == 0].max() < r[grid[:, 0] == 1].min()


@pytest.mark.parametrize("lam", [(0.6, 0.4), (0.9, 0.2), (-0.1, 0.1)])
def test_bad_lambdas_raise_naming_the_keys(lam):
  with pytest.raises(ValueError, match="lambda_pw"):
    pertmind.check_lambdas(*lam)
  with pytest.raises(ValueError, match="config.pertmind.lambda_pw"):
    pertmind.PertMindRewards(*lam, use_conf=True)


def test_confidence_weight_proposal():
  assert pertmind.confidence_weight("Up", 1.0, 1e-3) == 1.0
  assert pertmind.confidence_weight("Down", -1.0, 0.1, scale=2.0) == pytest.approx(0.75)
  assert pertmind.confidence_weight("No", 0.0, 0.9) == 1.0
  assert pertmind.confidence_weight("No", 0.19, 0.9, minimum=0.0) == pytest.approx(0.05)
  with pytest.raises(ValueError, match="label"):
    pertmind.confidence_weight("Maybe", 0.0, 1.0)


def test_weighted_advantages_scale_by_w_conf_and_zero_variance_groups_get_zero_gradient():
  rewards = np.array([1.4, 0.1, 1.0, 0.4, 1.1, 1.1, 1.1, 1.1], np.float32)
  groups = np.repeat(np.arange(2), 4)
  weights = np.repeat(np.array([0.5, 0.9], np.float32), 4)
  adv = np.asarray(pertmind.weighted_group_advantages(rewards, groups, weights, num_groups=2))
  g = rewards[:4].astype(np.float64)
  np.testing.assert_allclose(adv[:4], 0.5 * (g - g.mean()) / (g.std(ddof=1) + 1e-6), rtol=1e-5)
  assert np.all(adv[4:] == 0.0)
  # The objective Σ A_i logp_i: zero gradient into a zero-variance group's log-probs.
  grad = jax.grad(lambda logp: jnp.sum(jnp.asarray(adv) * logp))(jnp.zeros(8))
  assert np.all(np.asarray(grad)[4:] == 0.0)
  # Doubling a query's weight doubles its advantages (the per-query objective weight).
  adv2 = pertmind.weighted_group_advantages(rewards, groups, 2 * weights, num_groups=2)
  np.testing.assert_allclose(np.asarray(adv2), 2 * adv, rtol=1e-6)


def test_part_rows_and_config_section():
  part = pertmind.build_pertmind({"pertmind": dict(lambda_pw=0.3, lambda_fmt=0.1)})
  assert pertmind.build_pertmind({}) is None
  reward, weights, pathway = part.rows([_record()], ["1:Up 2:No 3:Down ans:Up", "ans:No"], 2)
  np.testing.assert_allclose(reward, [1.0 + 0.3 + 0.1, 0.0], rtol=1e-6)
  np.testing.assert_allclose(weights, [0.8, 0.8])
  np.testing.assert_allclose(pathway, [1.0, 0.0])
  with pytest.raises(ValueError, match="config.pertmind"):
    pertmind.build_pertmind({"pertmind": dict(lambda_pw=0.3)})
