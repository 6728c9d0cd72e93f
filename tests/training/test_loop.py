"""training/loop.py with a toy method: cadence, resume with the method's state, early stop, aborts.

The method fits y = 3·x₀ − 2·x₁ with a linear layer on batches that depend only on (seed,
step), so a run stopped and resumed must log exactly what an uninterrupted one logs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.training import loop
from jaxrl_post.training.base_configs import loop_config, optimizer_config
from jaxrl_post.training.metrics import read_metrics
from jaxrl_post.training.train_state import make_train_step

W_TRUE = np.array([[3.0], [-2.0]], np.float32)


def _config(**overrides):
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


def _records(workdir, key):
  return [(r["step"], r[key]) for r in read_metrics(workdir) if key in r]


def test_cadence_eval_and_summary(tmp_path, capsys):
  config = _config()
  state = loop.train(config, tmp_path, Regression(config))
  assert int(state.step) == 6
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3, 4, 5, 6]
  assert [s for s, _ in _records(tmp_path, "eval/rows_seen")] == [0, 3, 6]
  losses = [v for _, v in _records(tmp_path, "train/mse")]
  assert losses[-1] < 0.5 * losses[0]  # it learns
  assert "regression: 48 rows" in capsys.readouterr().out


def test_resume_gives_the_uninterrupted_history_and_method_state(tmp_path):
  straight = _config()
  loop.train(straight, tmp_path / "straight", Regression(straight))
  # Stop after step 4 (a checkpoint step), then rerun the full command in the same workdir.
  first = _config(steps=4)
  loop.train(first, tmp_path / "resumed", Regression(first))
  again = _config()
  method = Regression(again)
  loop.train(again, tmp_path / "resumed", method)
  assert method.rows_seen == 48  # restored 32, then 2 more steps
  for key in ("train/mse", "train/rows_seen", "train/x_sum"):
    assert _records(tmp_path / "resumed", key) == _records(tmp_path / "straight", key), key
  # The same evaluations, plus the one the 4-step run made at its last step.
  assert _records(tmp_path / "resumed", "eval/rows_seen") == sorted(
    _records(tmp_path / "straight", "eval/rows_seen") + [(4, 32.0)])
  # The method started from the starting policy, not the checkpoint it resumed from (what a
  # frozen reference copied in `start` must be).
  initial = nnx.Linear(2, 1, rngs=nnx.Rngs(again.seed))
  for started, init in zip(method.started_with,
                           jax.tree.leaves(nnx.state(initial, nnx.Param)), strict=True):
    np.testing.assert_array_equal(started, np.asarray(init))


def test_done_stops_early_with_a_checkpoint_and_a_rerun_does_nothing(tmp_path):
  config = _config(stop_at=3, checkpoint_every=100, eval_every=100)
  loop.train(config, tmp_path, Regression(config))
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3]
  assert [s for s, _ in _records(tmp_path, "eval/rows_seen")] == [0, 3]
  method = Regression(config)
  loop.train(config, tmp_path, method)
  assert method.rows_seen == 24  # restored, no step taken
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3]


def test_nonfinite_updates_abort_naming_the_key(tmp_path):
  config = _config(nan_from_step=2, max_nonfinite_streak=3)
  with pytest.raises(RuntimeError, match=r"3 updates in a row.*step 4.*max_nonfinite_streak=3"):
    loop.train(config, tmp_path, Regression(config))


def test_a_mesh_that_does_not_fit_fails_before_building(tmp_path):
  config = _config()
  config.mesh.ici_fsdp = 3
  method = Regression(config)
  method.build_model = lambda run: pytest.fail("built a model on an impossible mesh")
  with pytest.raises(ValueError, match="config.mesh.ici_fsdp=3"):
    loop.train(config, tmp_path, method)


def test_eval_summary_reads_nan_written_as_a_string():
  records = [{"step": 0, "eval/x": 0.5}, {"step": 3, "eval/x": "nan"}, {"step": 4}]
  assert loop.eval_summary(records, "eval/x", "x") == "x: 0.500 at step 0 → nan at step 3"
  assert loop.eval_summary(records, "eval/y", "y") == ""
