"""SIGTERM to one of two processes: both save the same step, exit cleanly, and a rerun resumes.

The orbax save is collective, so a stop that only the signalled process knew of would hang or
tear the checkpoint. `PreemptionGuard.stop_agreed` all-gathers the flags each step, so both
processes stop after the same step. The run is this file itself as a binary (a linear
regression `loop.Method` that sleeps a little per step, so the signal lands mid-run), two
processes on localhost joined through `jax.distributed` over gloo, as in
test_multihost_runlocal.py:

  python tests/experiments/test_preemption_multihost.py \
    --config=tests/experiments/test_preemption_multihost.py --workdir=/tmp/run
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import portpicker
from flax import nnx

from jaxrl_post.training import loop
from jaxrl_post.training.base_configs import loop_config, optimizer_config
from jaxrl_post.training.metrics import read_metrics
from jaxrl_post.training.train_state import make_train_step

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]


def get_config():
  """Many slow steps, no periodic checkpoint: only the preemption save can exist."""
  config = loop_config()
  config.steps = 10_000
  config.optimizer = optimizer_config(lr=0.1, name="sgd", decay_steps=10_000)
  config.eval_every = 100_000
  config.checkpoint_every = 100_000
  config.log_every = 1
  config.eval_at_start = False
  config.compilation_cache_dir = ""
  config.metric_writers = "jsonl"
  config.step_sleep_s = 0.05
  return config


def _mse(model, batch):
  loss = jnp.mean((model(batch["x"]) - batch["y"]) ** 2)
  return loss, {"mse": loss}


class Regression:
  """A `loop.Method`: SGD on y = 3·x₀ − 2·x₁; batches depend on (seed, step) only."""

  name = "regression"
  updates_per_step = 1

  def __init__(self, config):
    self.config = config
    self.rows_seen = 0

  def build_model(self, run):
    return nnx.Linear(2, 1, rngs=nnx.Rngs(run.config.seed))

  def start(self, run, state):
    del state
    self.step_fn = make_train_step(run.graphdef, _mse, run.optimizer)

  def step(self, state, step):
    x = np.random.default_rng([self.config.seed, step]).normal(size=(8, 2)).astype(np.float32)
    state, metrics = self.step_fn(state, {"x": x, "y": x @ np.array([[3.0], [-2.0]], np.float32)})
    time.sleep(self.config.step_sleep_s)
    self.rows_seen += 8
    return state, {"train/loss": float(metrics["loss"]), "train/rows_seen": self.rows_seen,
                   "train/nonfinite_streak": int(metrics["nonfinite_streak"])}

  def evaluate(self, state, step):
    del state, step
    return {"eval/rows_seen": float(self.rows_seen)}

  def state_dict(self):
    return {"rows_seen": self.rows_seen}

  def load_state_dict(self, state):
    self.rows_seen = state["rows_seen"]

  def summary(self, records):
    del records
    return f"regression: {self.rows_seen} rows"


def _launch(workdir, port, *overrides):
  """Two processes with one CPU device each; logs in workdir/../process_<i>.log."""
  processes = []
  for index in range(2):
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(index), PYTHONPATH=str(ROOT))
    log = open(workdir.parent / f"process_{index}.log", "w")  # noqa: SIM115 - the child's
    processes.append(subprocess.Popen(
      [sys.executable, str(THIS), f"--config={THIS}", f"--workdir={workdir}", *overrides],
      env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
  return processes


def _log(workdir, index):
  return (workdir.parent / f"process_{index}.log").read_text()


def _logs(workdir):
  return "\n".join(f"--- process {i} ---\n{_log(workdir, i)[-3000:]}" for i in range(2))


def test_sigterm_to_one_process_stops_both_after_the_same_step(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  processes = _launch(workdir, portpicker.pick_unused_port())
  deadline = time.monotonic() + 300
  while len(read_metrics(workdir)) < 3:
    assert time.monotonic() < deadline and all(p.poll() is None for p in processes), (
      _logs(workdir))
    time.sleep(0.2)
  processes[1].send_signal(signal.SIGTERM)  # process 1 only; process 0 must follow
  codes = [p.wait(timeout=120) for p in processes]
  assert codes == [0, 0], _logs(workdir)

  stopped = []
  for index in range(2):
    found = re.findall(r"process (\d) of 2: (.*): stopped after step (\d+)", _log(workdir, index))
    assert len(found) == 1, _logs(workdir)
    assert int(found[0][0]) == index
    stopped.append(int(found[0][2]))
  assert "SIGTERM" in _log(workdir, 1) and "process(es) [1]" in _log(workdir, 0)
  assert stopped[0] == stopped[1] >= 3, stopped
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved == [stopped[0]]

  # The same command (with a near end) resumes on both processes after the saved step.
  end = stopped[0] + 2
  processes = _launch(workdir, portpicker.pick_unused_port(), f"--config.steps={end}")
  assert [p.wait(timeout=300) for p in processes] == [0, 0], _logs(workdir)
  records = [r for r in read_metrics(workdir) if "train/loss" in r]
  assert [r["step"] for r in records] == list(range(1, end + 1))
  assert [r["train/rows_seen"] for r in records] == [8 * s for s in range(1, end + 1)]
  assert f"regression: {8 * end} rows" in _log(workdir, 0)


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  loop.main(Regression)
