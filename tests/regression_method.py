"""A toy `loop.Method` for the loop's tests: SGD on y = 3·x₀ − 2·x₁ with a linear layer.

Batches depend only on (seed, step), so a run stopped and resumed must log exactly what an
uninterrupted one logs. It counts the rows it has seen (JSON state) and sums the inputs
(array state), can turn its batches to NaN from a step on, stop early, or sleep per step.
Used by tests/training/test_loop.py, test_epath_workdir.py and
tests/experiments/test_preemption_multihost.py (which runs it as a binary).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post.training.base_configs import loop_config, optimizer_config
from jaxrl_post.training.train_state import make_train_step

W_TRUE = np.array([[3.0], [-2.0]], np.float32)


def regression_config(**overrides):
  config = loop_config()
  config.steps = 6
  config.optimizer = optimizer_config(lr=0.1, name="sgd")
  # A fixed schedule horizon: a run stopped at step 4 is then a prefix of the 6-step run.
  config.optimizer.decay_steps = 6
  config.eval_every = 3
  config.checkpoint_every = 2
  config.log_every = 1
  config.batch_size = 8
  config.nan_from_step = 0  # > 0: batches from this step on are NaN
  config.stop_at = 0  # > 0: `done` after this step
  config.step_sleep_s = 0.0  # > 0: each step sleeps this long (a signal can land mid-run)
  config.update(overrides)
  return config


def _mse(model, batch):
  loss = jnp.mean((model(batch["x"]) - batch["y"]) ** 2)
  return loss, {"mse": loss}


class Regression:
  """A `loop.Method`: SGD on a linear regression; counts the rows it has seen (JSON state) and
  sums the inputs it has seen (array state, `array_state`)."""

  name = "regression"
  updates_per_step = 1

  def __init__(self, config):
    self.config = config
    self.rows_seen = 0
    self.x_sum = np.zeros((2,), np.float64)
    self.started_with = None

  def build_model(self, run):
    return nnx.Linear(2, 1, rngs=nnx.Rngs(run.config.seed))

  def start(self, run, state):
    self.started_with = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    self.step_fn = make_train_step(run.graphdef, _mse, run.optimizer)

  def batch(self, step):
    rng = np.random.default_rng([self.config.seed, step])
    x = rng.normal(size=(self.config.batch_size, 2)).astype(np.float32)
    if self.config.nan_from_step and step >= self.config.nan_from_step:
      x = np.full_like(x, np.nan)
    return {"x": x, "y": x @ W_TRUE}

  def step(self, state, step):
    state, metrics = self.step_fn(state, self.batch(step))
    if self.config.step_sleep_s:
      time.sleep(self.config.step_sleep_s)
    self.rows_seen += self.config.batch_size
    self.x_sum += self.batch(step)["x"].sum(0)
    record = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}
    return state, dict(record, **{"train/rows_seen": self.rows_seen,
                                  "train/x_sum": float(self.x_sum @ [1.0, 10.0])})

  def evaluate(self, state, step):
    del state, step
    return {"eval/rows_seen": float(self.rows_seen)}

  def state_dict(self):
    return {"rows_seen": self.rows_seen}

  def load_state_dict(self, state):
    self.rows_seen = state["rows_seen"]

  def array_state(self):
    return {"x_sum": self.x_sum}

  def load_array_state(self, arrays):
    self.x_sum = np.array(arrays["x_sum"])

  def done(self, step):
    return bool(self.config.stop_at) and step >= self.config.stop_at

  def summary(self, records):
    return f"regression: {self.rows_seen} rows"
