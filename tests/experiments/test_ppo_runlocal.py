"""PPO with a critic on the one loop (configs/ppo_arith.py, runlocal): the critic's metrics are
logged, the policy trains on per-token GAE advantages, and a stopped-and-resumed run repeats the
uninterrupted one (the critic's parameters and Adam state are in the checkpoint's `sharded`
item, written like the policy's state)."""

import math
from pathlib import Path

import jax
import numpy as np
import pytest
from runlocal_helpers import train_grpo

from jaxrl_post.config_args import load_module
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CRITIC_KEYS = ("critic/value_loss", "critic/explained_variance", "critic/value_mean",
               "critic/clip_frac", "critic/old_value_mean", "critic/return_mean")


def _config(init_from, **overrides):
  config = load_module(ROOT / "configs" / "ppo_arith.py").get_config("runlocal")
  # 4 prompts × 4 completions: enough rollouts that the format writer earns some rewards.
  config.update(dict(dict(init_from=str(init_from), steps=2, prompts_per_step=4, eval_every=100,
                          eval_pass_k=0, checkpoint_every=1, compilation_cache_dir=""),
                     **overrides))
  return config


def _steps(workdir):
  return [r for r in read_metrics(workdir) if "train/loss" in r]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, format_writer_policy):
  """An uninterrupted 2-step run: `(method, records)`."""
  workdir = tmp_path_factory.mktemp("ppo") / "straight"
  return train_grpo(_config(format_writer_policy), workdir), _steps(workdir)


def test_ppo_logs_the_critic_and_trains_it(straight):
  method, records = straight
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert all(math.isfinite(r[key]) for key in CRITIC_KEYS), r
    assert r["critic/num_updates"] == 2  # epochs 1 × ppo_mini_batches 2
    assert 0 <= r["critic/clip_frac"] <= 1
  # The format writer earns some rewards: the critic has something to fit, and it moves.
  assert any(r["critic/return_mean"] > 0 for r in records)
  assert records[0]["critic/old_value_mean"] == 0.0  # the zero head of a new critic
  assert records[1]["critic/old_value_mean"] != 0.0  # after one round of value updates
  assert max(r["critic/value_loss"] for r in records) > 0
  assert max(abs(r["train/loss"]) for r in records) > 0
  assert int(method.parts["critic"].state.step) == 4


@pytest.mark.slow
def test_ppo_resumes_exactly(tmp_path, format_writer_policy, straight):
  method, records = straight
  train_grpo(_config(format_writer_policy, steps=1), tmp_path / "resumed")
  resumed = train_grpo(_config(format_writer_policy), tmp_path / "resumed")
  again = _steps(tmp_path / "resumed")
  for key in ("train/loss", *CRITIC_KEYS):
    assert [(r["step"], r[key]) for r in again] == [(r["step"], r[key]) for r in records], key
  saved = method.parts["critic"].sharded_state()
  restored = resumed.parts["critic"].sharded_state()
  pairs = zip(jax.tree.leaves(saved), jax.tree.leaves(restored), strict=True)
  for a, b in pairs:
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim)  # restored in the critic's layout
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  # The checkpoint holds the critic as its own sharded item, not as host arrays.
  latest = tmp_path / "resumed" / "checkpoints" / "2"
  assert (latest / "sharded").is_dir() and not (latest / "arrays").exists()
