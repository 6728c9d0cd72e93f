"""methods.multi_lora without training: tenant configs (and the errors that name the key),
the stacked train state, and the per-tenant metric keys."""

from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import multi_lora as ml
from jaxrl_post.training.train_state import TrainState

ROOT = Path(__file__).resolve().parents[2]


def _config(**tenants):
  config = load_module(ROOT / "configs" / "multi_lora.py").get_config("runlocal")
  if tenants:
    config.multi_lora.tenants = tenants
  return config


def test_tenant_configs_apply_nested_overrides_and_keep_the_rest():
  configs = ml.tenant_configs(_config())
  assert sorted(configs) == ["minus", "plus"]
  assert configs["plus"].task_knobs.operations == "+"
  assert configs["minus"].task_knobs.operations == "-" and configs["minus"].seed == 1
  # Untouched keys, nested or not, are the run's.
  assert configs["minus"].task_knobs.max_digits == 2
  assert configs["minus"].optimizer.lr == configs["plus"].optimizer.lr


@pytest.mark.parametrize("tenants, match", [
  ({"a": {"model": "small"}}, r"tenants.a: \['model'\] are shared by every tenant"),
  ({"a": {"lora": {"rank": 2}}}, r"\['lora'\] are shared"),
  ({"a": {"optimizer": {"lrr": 1.0}}}, r"tenants.a.optimizer.lrr: the run's config has no key"),
  ({"a": {"nope": 1}}, r"tenants.a.nope"),
  ({"a/b": {}}, r"tenants.a/b: a tenant name must start with a letter"),
])
def test_bad_tenants_name_the_key(tenants, match):
  with pytest.raises(ValueError, match=match):
    ml.tenant_configs(_config(**tenants))


def test_no_tenants_or_no_lora_fail_naming_the_key():
  config = _config()
  config.multi_lora.tenants = {}
  with pytest.raises(ValueError, match=r"config.multi_lora.tenants is empty"):
    ml.tenant_configs(config)
  config = _config()
  config.lora.rank = 0
  with pytest.raises(ValueError, match=r"config.lora.rank=0"):
    ml.tenant_configs(config)


def test_stacked_state_round_trips_and_keys_are_tagged():
  def state(x):
    return TrainState(step=jnp.int32(x), params={"w": jnp.full((2,), x)}, opt_state=(),
                      rng=jnp.zeros((2,), jnp.uint32), nonfinite_streak=jnp.int32(0),
                      nonfinite_total=jnp.int32(0))

  stacked = ml.stack_states({"a": state(1), "b": state(2)})
  assert stacked.params == {"a": {"w": stacked.params["a"]["w"]}, "b": stacked.params["b"]}
  assert int(ml.tenant_state(stacked, "b").step) == 2
  assert float(ml.tenant_state(stacked, "a").params["w"][0]) == 1.0
  assert ml.tenant_key("train/loss", "a") == "train/a/loss"
  assert ml.tenant_key("loss", "a") == "a/loss"
  records = [{"step": 1, "train/a/loss": 1.0, "train/b/loss": 2.0, "eval/a/accuracy": 0.5},
             {"step": 2, "train/b/loss": 3.0}]
  assert ml.tenant_records(records, "a") == [
    {"step": 1, "train/loss": 1.0, "eval/accuracy": 0.5}]
  assert ml.tenant_records(records, "b") == [{"step": 1, "train/loss": 2.0},
                                             {"step": 2, "train/loss": 3.0}]
