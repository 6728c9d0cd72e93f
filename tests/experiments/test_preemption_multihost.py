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
import portpicker
from regression_method import Regression, regression_config

from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]


def get_config():
  """Many slow steps, no periodic checkpoint: only the preemption save can exist."""
  config = regression_config(steps=10_000, eval_every=100_000, checkpoint_every=100_000,
                             eval_at_start=False, compilation_cache_dir="",
                             metric_writers="jsonl", step_sleep_s=0.05)
  config.optimizer.decay_steps = 10_000
  return config


def _launch(workdir, port, *overrides):
  """Two processes with one CPU device each; logs in workdir/../process_<i>.log."""
  processes = []
  for index in range(2):
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(index),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
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
