"""Global normalisers: micro-batch accumulation and 8-device sharding reproduce the full batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import loss_normalizers, policy_loss

ARRAYS = ("logp", "old_logp", "adv_t", "mask", "ref_logp", "sampler_logp", "entropy")
KITCHEN_SINK = dict(epsilon_high=0.28, dual_clip_c=3.0, beta=0.1, kl_estimator="k3",
                    sampler_level="sequence", sampler_correction="mask", sampler_max=1.5)
CONFIGS = [
    dict(loss_agg_mode="token-mean", **KITCHEN_SINK),
    dict(loss_agg_mode="seq-mean-token-mean", **KITCHEN_SINK),
    dict(loss_agg_mode="seq-mean-token-sum", **KITCHEN_SINK),
    dict(loss_agg_mode="seq-mean-token-sum-norm", max_tokens=10, **KITCHEN_SINK),
    dict(loss_agg_mode="seq-mean-token-mean", importance_sampling_level="sequence"),
    dict(loss_agg_mode="token-mean", objective="cispo", cispo_max_weight=1.5,
         importance_sampling_level="sequence_token"),
    dict(loss_agg_mode="seq-mean-token-sum", objective="sapo"),
]
IDS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "drgrpo", "gspo",
       "cispo_gspo_token", "sapo"]
ADDITIVE = ("pg_loss", "kl_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high",
            "clip_frac_dual", "ratio_mean", "sampler_weight_mean")


def _value_and_grad(logp, old_logp, adv_t, mask, ref_logp, sampler_logp, entropy,
                    num_tokens=None, num_sequences=None, *, kw):
  fn = lambda lp: policy_loss(lp, old_logp, adv_t, mask, ref_logp=ref_logp,
                              sampler_logp=sampler_logp, entropy=entropy, num_tokens=num_tokens,
                              num_sequences=num_sequences, **dict(kw))
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  return loss, aux, grad


value_and_grad = jax.jit(_value_and_grad, static_argnames="kw")


def _args(r):
  return [jnp.asarray(r[k]) for k in ARRAYS]


@pytest.mark.parametrize("kw", CONFIGS, ids=IDS)
def test_micro_batch_accumulation_is_exact(rollout, kw):
  kw = tuple(sorted(kw.items()))
  loss, aux, grad = value_and_grad(*_args(rollout), kw=kw)
  norm = loss_normalizers(rollout["mask"])  # once, over the full batch
  parts = [value_and_grad(*[a[i:i + 2] for a in _args(rollout)], *norm, kw=kw)
           for i in range(0, 8, 2)]
  np.testing.assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.concatenate([p[2] for p in parts]), grad, rtol=1e-5, atol=1e-7)
  for field in ADDITIVE:
    if getattr(aux, field) is not None:
      np.testing.assert_allclose(sum(getattr(p[1], field) for p in parts), getattr(aux, field),
                                 rtol=1e-5, atol=1e-7, err_msg=field)
  np.testing.assert_allclose(min(p[1].ratio_min for p in parts), aux.ratio_min, rtol=1e-6)
  np.testing.assert_allclose(max(p[1].ratio_max for p in parts), aux.ratio_max, rtol=1e-6)
  # Without the global normalisers a token-mean micro-batch is a different (local) mean.
  if dict(kw)["loss_agg_mode"] == "token-mean":
    local = 0.0
    for i in range(0, 8, 2):
      micro = [a[i:i + 2] for a in _args(rollout)]
      local += value_and_grad(*micro, *loss_normalizers(micro[3]), kw=kw)[0] / 4
    assert abs(float(local) - float(loss)) > 1e-4


def _mesh():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  return Mesh(np.array(jax.devices()), ("data",))


@pytest.mark.parametrize("kw", [CONFIGS[0], CONFIGS[1], CONFIGS[4]], ids=[IDS[0], IDS[1], IDS[4]])
def test_sharded_batch_matches_single_device(make_rollout, kw):
  kw = tuple(sorted(kw.items()))
  r = make_rollout(batch=16, empty_row=True)
  args = _args(r)
  single = value_and_grad(*[jax.device_put(a, jax.devices()[0]) for a in args], kw=kw)
  rows = NamedSharding(_mesh(), P("data"))
  sharded_args = [jax.device_put(a, rows) for a in args]
  loss, aux, grad = value_and_grad(*sharded_args, kw=kw)
  assert len(sharded_args[0].sharding.device_set) == 8
  np.testing.assert_allclose(loss, single[0], rtol=1e-5)
  np.testing.assert_allclose(grad, single[2], rtol=1e-5, atol=1e-7)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), aux,
               single[1])


def test_shard_map_with_psum_normalizers(make_rollout):
  # Inside shard_map each device sees only its rows: psum the normalisers, then psum the loss.
  r = make_rollout(batch=16)
  kw = dict(loss_agg_mode="seq-mean-token-mean", **KITCHEN_SINK)

  def local(logp, old_logp, adv, mask, ref_logp, sampler_logp, entropy):
    norm = jax.lax.psum(loss_normalizers(mask), "data")
    loss, _, grad = _value_and_grad(logp, old_logp, adv, mask, ref_logp, sampler_logp, entropy,
                                    *norm, kw=tuple(sorted(kw.items())))
    return jax.lax.psum(loss, "data"), grad

  fn = jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P("data"),) * 7,
                             out_specs=(P(), P("data"))))
  loss, grad = fn(*_args(r))
  ref_loss, _, ref_grad = value_and_grad(*_args(r), kw=tuple(sorted(kw.items())))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_no_recompilation_across_steps(make_rollout):
  step = jax.jit(functools.partial(_value_and_grad, kw=tuple(sorted(CONFIGS[0].items()))))
  for seed in (3, 4):
    jax.block_until_ready(step(*_args(make_rollout(seed=seed))))
  assert step._cache_size() == 1
