"""Random rollout batches shared by the loss tests."""

import numpy as np
import pytest


def _make_rollout(seed=1, batch=8, time=6, spread=0.6, empty_row=False):
  """A ragged batch: log-probs of 'sampled tokens', old / reference / sampler log-probs nearby.

  Log-ratios are ~N(0, spread) so that a fair share of tokens falls outside a 0.2 clip range,
  advantages have both signs, and padding holds garbage (−inf / NaN) that the losses must ignore.
  """
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, time + 1, size=batch)
  if empty_row:
    lengths[1] = 0
  mask = (np.arange(time)[None, :] < lengths[:, None]).astype(np.float32)
  logp = np.log(rng.uniform(0.05, 0.95, size=(batch, time))).astype(np.float32)
  old_logp = (logp + spread * rng.standard_normal((batch, time))).astype(np.float32)
  ref_logp = (logp + spread * rng.standard_normal((batch, time))).astype(np.float32)
  sampler_logp = (old_logp + 0.5 * spread * rng.standard_normal((batch, time))).astype(np.float32)
  adv = rng.standard_normal(batch).astype(np.float32)
  adv_t = rng.standard_normal((batch, time)).astype(np.float32)
  entropy = rng.uniform(0.0, 3.0, size=(batch, time)).astype(np.float32)
  pad = mask == 0
  logp_padded = np.where(pad, -np.inf, logp).astype(np.float32)
  return dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp, sampler_logp=sampler_logp,
              adv=adv, adv_t=adv_t, mask=mask, entropy=entropy, logp_padded=logp_padded)


@pytest.fixture
def make_rollout():
  return _make_rollout


@pytest.fixture
def rollout():
  return _make_rollout()
