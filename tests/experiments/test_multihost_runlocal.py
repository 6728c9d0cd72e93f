"""experiments/grpo.py as 2 processes × 4 CPU devices on localhost (jax.distributed + gloo).

The processes join through `JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` /
`JAX_PROCESS_ID` (what scripts/launch_slurm.sh sets) and run the `runlocal`
GRPO config over one 8-device mesh. With `config.data_shards=2` the global
batch is the same as a single 8-device process reading both shards, so the
per-step metrics must agree. A killed process must bring the other down with
a clear message within a bounded time, and the same command must resume.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import portpicker
import pytest

from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/loss", "train/grad_norm", "train/reward_correct", "train/reward_format")
# 4 steps, checkpoints every 2; evaluation only where the binary must (steps 0, 4).
ARGS = ("--config.steps=4", "--config.eval_every=100", "--config.checkpoint_every=2",
        "--config.eval_pass_k=0", "--config.eval_examples=2", "--config.data_shards=2")
# The kill test's backstop for a hung peer. The other tests keep the
# library's default (100 s): on a loaded 2-core CI runner a 10 s time-out
# aborted two healthy processes in the middle of an XLA compile.
KILL_TEST_HEARTBEAT_S = 20


def _command(workdir, policy):
  return [sys.executable, str(ROOT / "experiments" / "grpo.py"),
          f"--config={ROOT / 'configs' / 'grpo_arith.py'}:runlocal", f"--workdir={workdir}",
          f"--config.init_from={policy}", *ARGS]


def _launch(workdir, policy, port, command=None, heartbeat_s=100):
  """Starts the two processes; their logs go to workdir/../process_<i>.log."""
  processes = []
  for index in range(2):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(index), JAXRL_POST_HEARTBEAT_TIMEOUT_S=str(heartbeat_s))
    log = open(Path(workdir).parent / f"process_{index}.log", "w")
    processes.append(subprocess.Popen(command or _command(workdir, policy), env=env, stdout=log,
                                      stderr=subprocess.STDOUT, text=True))
  return processes


def _wait(processes, timeout=600):
  codes = [p.wait(timeout=timeout) for p in processes]
  return codes


def _log(workdir, index):
  return (Path(workdir).parent / f"process_{index}.log").read_text()


def _failure(workdir):
  """Both logs' error lines first (an abort's stack dump would hide them), then their tails."""
  parts = []
  for index in range(2):
    log = _log(workdir, index)
    errors = [line for line in log.splitlines()
              if line[:1] in "EF" and line[1:5].isdigit() or "Error" in line or "error" in line]
    parts.append(f"--- process {index}: error lines ---\n" + "\n".join(errors[:20])
                 + f"\n--- process {index}: tail ---\n" + log[-2000:])
  return "\n".join(parts)


def _train_records(workdir):
  return [r for r in read_metrics(workdir) if "train/loss" in r]


@pytest.fixture(scope="module")
def single_process(format_writer_policy, tmp_path_factory):
  """The reference: one process with 8 devices reading both data shards."""
  workdir = tmp_path_factory.mktemp("single") / "run"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  result = subprocess.run(_command(workdir, format_writer_policy), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  records = _train_records(workdir)
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  assert max(r["train/grad_norm"] for r in records) > 1e-2  # not a comparison of zeros
  return records


def _assert_same_metrics(records, reference):
  assert [r["step"] for r in records] == [r["step"] for r in reference]
  for mine, theirs in zip(records, reference):
    for key in COMPARED:
      # Same global batch and rng, so the same tokens and rewards; loss and
      # gradient norm differ by float32 summation order only (as on one host).
      np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-4, atol=1e-6,
                                 err_msg=f"{key} at step {theirs['step']}")


@pytest.mark.slow
def test_two_processes_match_one_process(format_writer_policy, single_process, tmp_path):
  workdir = tmp_path / "run"
  codes = _wait(_launch(workdir, format_writer_policy, portpicker.pick_unused_port()))
  assert codes == [0, 0], _failure(workdir)
  # Only process 0 writes metrics: each step appears once.
  _assert_same_metrics(_train_records(workdir), single_process)
  assert "held-out accuracy" in _log(workdir, 0)


@pytest.mark.slow
def test_a_killed_process_stops_the_other_and_the_run_resumes(format_writer_policy,
                                                              single_process, tmp_path):
  workdir = tmp_path / "run"
  processes = _launch(workdir, format_writer_policy, portpicker.pick_unused_port(),
                      heartbeat_s=KILL_TEST_HEARTBEAT_S)
  # Kill process 1 once the checkpoint of step 2 is on disk and step 3 is logged.
  deadline = time.monotonic() + 600
  while not any(r.get("step") == 3 for r in _train_records(workdir)):
    assert time.monotonic() < deadline and processes[0].poll() is None, _log(workdir, 0)[-3000:]
    time.sleep(0.2)
  processes[1].send_signal(signal.SIGKILL)
  killed_at = time.monotonic()
  code = processes[0].wait(timeout=120)
  elapsed = time.monotonic() - killed_at
  processes[1].wait()
  assert code != 0
  # Bounded: the next collective fails at once (gloo sees the closed socket);
  # the heartbeat time-out is the backstop for a peer that hangs.
  assert elapsed < KILL_TEST_HEARTBEAT_S + 30, elapsed
  # Two ways down, both naming the cause: a collective that errors (our
  # message, from multihost.peer_failures_are_fatal), or one that blocks until
  # the coordination service sees the missing heartbeats and aborts the process.
  log = _log(workdir, 0)
  assert ("a collective failed during grpo training" in log
          or "another task died" in log and "stopped sending heartbeats" in log), log[-3000:]
  assert (workdir / "checkpoints" / "2").is_dir()

  # The same command resumes from step 2 and ends as the uninterrupted run.
  codes = _wait(_launch(workdir, format_writer_policy, portpicker.pick_unused_port()))
  assert codes == [0, 0], _failure(workdir)
  _assert_same_metrics(_train_records(workdir), single_process)


def _sft_command(workdir):
  return [sys.executable, str(ROOT / "experiments" / "sft.py"),
          f"--config={ROOT / 'configs' / 'sft_arith.py'}:runlocal", f"--workdir={workdir}",
          "--config.steps=3", "--config.data_shards=2", "--config.eval_every=100",
          "--config.eval_examples=2"]


@pytest.mark.slow
def test_sft_on_two_processes_matches_one_process(tmp_path):
  """A second method on the same loop: SFT's global batch from 2 processes' shards."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  result = subprocess.run(_sft_command(tmp_path / "single"), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  workdir = tmp_path / "two" / "run"
  workdir.parent.mkdir()
  codes = _wait(_launch(workdir, None, portpicker.pick_unused_port(), _sft_command(workdir)))
  assert codes == [0, 0], _failure(workdir)
  single = [r for r in read_metrics(tmp_path / "single") if "train/nll" in r]
  two = [r for r in read_metrics(workdir) if "train/nll" in r]
  assert [r["step"] for r in two] == [r["step"] for r in single] == [1, 2, 3]
  for mine, theirs in zip(two, single):
    for key in ("train/nll", "train/grad_norm"):  # Tolerance: as for GRPO above.
      np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-4, atol=1e-6, err_msg=key)
