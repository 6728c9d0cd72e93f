"""`config.profile_steps`: a JAX profiler trace of the chosen steps in workdir/profile."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxrl_post.training import loop
from jaxrl_post.training.base_configs import loop_config, optimizer_config
from jaxrl_post.training.profiling import StepProfiler, parse_profile_steps


@pytest.mark.parametrize("value,expected", [
  ("", None), (None, None), ((), None), ("  ", None), ("5", (5, 5)), ("2,4", (2, 4)),
  ("2:4", (2, 4)), (" 2 , 4 ", (2, 4)), ((3, 7), (3, 7)), ([1, 1], (1, 1)), (6, (6, 6)),
])
def test_parse_profile_steps(value, expected):
  assert parse_profile_steps(value) == expected


@pytest.mark.parametrize("value", ["4,2", "0,3", "a,b", "1,2,3", "-1"])
def test_a_bad_value_names_the_config_key(value):
  with pytest.raises(ValueError, match=r"config.profile_steps=.*expected"):
    parse_profile_steps(value)


class Matmuls:
  """A `loop.Method` whose steps are a jitted matmul (work for the trace); no updates."""

  name = "matmuls"
  updates_per_step = 1

  def __init__(self):
    self.steps = []

  def build_model(self, run):
    return nnx.Linear(4, 4, rngs=nnx.Rngs(run.config.seed))

  def start(self, run, state):
    del run, state
    self.fn = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())

  def step(self, state, step):
    self.steps.append(step)
    return state, {"train/value": self.fn(jnp.full((64, 64), step / 100.0)),
                   "train/nonfinite_streak": 0}

  def evaluate(self, state, step):
    del state, step
    return {}

  def state_dict(self):
    return {}

  def load_state_dict(self, state):
    del state

  def summary(self, records):
    del records
    return ""


def _config(profile_steps):
  config = loop_config()
  config.steps = 4
  config.optimizer = optimizer_config(lr=0.1, name="sgd")
  config.eval_every = 100
  config.checkpoint_every = 100
  config.eval_at_start = False
  config.compilation_cache_dir = ""
  config.metric_writers = "jsonl"
  config.profile_steps = profile_steps
  return config


def test_the_trace_of_the_chosen_steps_lands_in_workdir_profile(tmp_path):
  method = Matmuls()
  loop.train(_config("2,3"), tmp_path, method)
  assert method.steps == [1, 2, 3, 4]
  traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0, traces


def test_off_by_default_and_on_process_0_only(tmp_path, monkeypatch):
  loop.train(_config(""), tmp_path / "off", Matmuls())
  assert not (tmp_path / "off" / "profile").exists()
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert not StepProfiler((1, 2), tmp_path).enabled
  assert StepProfiler((1, 2), tmp_path, all_processes=True).enabled


def test_a_bad_value_fails_before_anything_is_built(tmp_path):
  with pytest.raises(ValueError, match=r"config.profile_steps='3,1'"):
    loop.train(_config("3,1"), tmp_path, method=None)
