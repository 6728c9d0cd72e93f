"""training/loop.py with a toy method (tests/regression_method.py): cadence, resume with the
method's state, early stop, aborts."""

import jax
import numpy as np
import pytest
from flax import nnx
from regression_method import Regression, regression_config

from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics


def _records(workdir, key):
  return [(r["step"], r[key]) for r in read_metrics(workdir) if key in r]


def test_cadence_eval_and_summary(tmp_path, capsys):
  config = regression_config()
  state = loop.train(config, tmp_path, Regression(config))
  assert int(state.step) == 6
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3, 4, 5, 6]
  assert [s for s, _ in _records(tmp_path, "eval/rows_seen")] == [0, 3, 6]
  losses = [v for _, v in _records(tmp_path, "train/mse")]
  assert losses[-1] < 0.5 * losses[0]  # it learns
  assert "regression: 48 rows" in capsys.readouterr().out


def test_resume_gives_the_uninterrupted_history_and_method_state(tmp_path):
  straight = regression_config()
  loop.train(straight, tmp_path / "straight", Regression(straight))
  # Stop after step 4 (a checkpoint step), then rerun the full command in the same workdir.
  first = regression_config(steps=4)
  loop.train(first, tmp_path / "resumed", Regression(first))
  again = regression_config()
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


def test_resuming_another_runs_checkpoint_fails_naming_the_key(tmp_path):
  elsewhere = regression_config(steps=2)
  loop.train(elsewhere, tmp_path / "elsewhere", Regression(elsewhere))
  first = regression_config(steps=2)
  loop.train(first, tmp_path, Regression(first))
  # Another seed or starting point in the same workdir would continue the first run's
  # trajectory under the new config: refused, before anything is built.
  other = regression_config(steps=4, seed=first.seed + 1)
  with pytest.raises(ValueError, match=rf"config.seed='{first.seed + 1}' \(the checkpoint's "
                     rf"run: '{first.seed}'\).*new --workdir"):
    loop.train(other, tmp_path, Regression(other))
  other = regression_config(steps=4, init_from=str(tmp_path / "elsewhere"))
  with pytest.raises(ValueError,
                     match="config.init_from='.*elsewhere' \\(the checkpoint's run: ''"):
    loop.train(other, tmp_path, Regression(other))
  other = regression_config(steps=4, task="another_task")
  with pytest.raises(ValueError, match="config.task='another_task' \\(the checkpoint's run: ''"):
    loop.train(other, tmp_path, Regression(other))
  # More steps (or any other key) resume as before.
  more = regression_config(steps=4)
  method = Regression(more)
  loop.train(more, tmp_path, method)
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3, 4]


def test_done_stops_early_with_a_checkpoint_and_a_rerun_does_nothing(tmp_path):
  config = regression_config(stop_at=3, checkpoint_every=100, eval_every=100)
  loop.train(config, tmp_path, Regression(config))
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3]
  assert [s for s, _ in _records(tmp_path, "eval/rows_seen")] == [0, 3]
  method = Regression(config)
  loop.train(config, tmp_path, method)
  assert method.rows_seen == 24  # restored, no step taken
  assert [s for s, _ in _records(tmp_path, "train/mse")] == [1, 2, 3]


def test_nonfinite_updates_abort_naming_the_key(tmp_path):
  config = regression_config(nan_from_step=2, max_nonfinite_streak=3)
  with pytest.raises(RuntimeError, match=r"3 updates in a row.*step 4.*max_nonfinite_streak=3"):
    loop.train(config, tmp_path, Regression(config))


def test_a_mesh_that_does_not_fit_fails_before_building(tmp_path):
  config = regression_config()
  config.mesh.ici_fsdp = 3
  method = Regression(config)
  method.build_model = lambda run: pytest.fail("built a model on an impossible mesh")
  with pytest.raises(ValueError, match="config.mesh.ici_fsdp=3"):
    loop.train(config, tmp_path, method)


def test_eval_summary_reads_nan_written_as_a_string():
  records = [{"step": 0, "eval/x": 0.5}, {"step": 3, "eval/x": "nan"}, {"step": 4}]
  assert loop.eval_summary(records, "eval/x", "x") == "x: 0.500 at step 0 → nan at step 3"
  assert loop.eval_summary(records, "eval/y", "y") == ""
