"""scripts/sweep.py expands config sweeps; the launch scripts parse, and set up jax.distributed."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import sweep  # noqa: E402

from jaxrl_post import script_flags  # noqa: E402

CONFIG = "configs/grpo_arith.py"


def _bash(*args, env=None, timeout=60):
  return subprocess.run(["bash", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                        env=None if env is None else {**os.environ, **env}, check=False)


# ---- sweep.py ----


def _main(*args):
  """`scripts/sweep.py ARGS...` in this process: its flags parsed from their defaults."""
  return sweep.main(script_flags.parse(sweep.FLAGS, ["sweep.py", *args]))


def test_sweep_expands_grpo_arith_into_nine_commands():
  runs = sweep.commands(f"{CONFIG}:runlocal", "/tmp/base/", extra=["--config.steps=2"])
  assert len(runs) == 9  # 3 losses × 3 learning rates
  names = [name for name, _ in runs]
  assert len(set(names)) == 9 and names[3] == "003_loss.name=gspo_optimizer.lr=2e-05"
  assert runs[3][1] == (
    "python experiments/grpo.py --config=configs/grpo_arith.py:runlocal "
    "--workdir=/tmp/base/003_loss.name=gspo_optimizer.lr=2e-05 --config.loss.name=gspo "
    "--config.optimizer.lr=2e-05 --config.steps=2")


def test_every_config_maps_to_an_existing_binary():
  for path in sorted((ROOT / "configs").glob("*.py")):
    if not hasattr(sweep.load_config_module(str(path)), "get_config"):
      continue  # a module the configs share (rtpo_common.py, rl_family_common.py)
    assert (ROOT / sweep.binary_for(str(path))).exists(), path


def test_values_are_formatted_as_config_flags_parse_them():
  assert sweep.format_value("a b") == "a b"
  assert sweep.format_value(True) == "True" and sweep.format_value(1e-4) == "0.0001"
  assert sweep.format_value([1, 2]) == "(1, 2)"
  assert sweep.run_name(7, {"task_knobs": "x/y z"}) == "007_task_knobs=x-y-z"


def test_dry_run_prints_and_runs_nothing(capsys, tmp_path):
  assert _main(f"--config={CONFIG}", f"--workdir={tmp_path}", "--dry-run",
               "--launcher=bash scripts/launch_slurm.sh --per=gpu --") == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 9
  assert lines[0].startswith("bash scripts/launch_slurm.sh --per=gpu -- python "
                             "experiments/grpo.py --config=configs/grpo_arith.py ")
  assert not list(tmp_path.iterdir())  # no workdir was created


def test_slurm_job_array_file_runs_the_task_it_is_given(tmp_path, capsys):
  script = tmp_path / "array.sbatch"
  assert _main(f"--config={CONFIG}:runlocal", f"--workdir={tmp_path}", "--slurm",
               f"--slurm_file={script}", "--dry-run", "--sbatch=--time=01:00:00",
               "--python=echo") == 0
  text = script.read_text()
  assert "#SBATCH --array=0-8" in text and "#SBATCH --time=01:00:00" in text
  assert (tmp_path / "slurm").is_dir()
  assert _bash("-n", str(script)).returncode == 0
  # With `--python=echo` each task prints its command instead of training.
  result = _bash(str(script), env={"SLURM_ARRAY_TASK_ID": "4"})
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[-1] == (
    f"experiments/grpo.py --config=configs/grpo_arith.py:runlocal "
    f"--workdir={tmp_path}/004_loss.name=gspo_optimizer.lr=5e-05 --config.loss.name=gspo "
    f"--config.optimizer.lr=5e-05")


def test_command_line_appends_the_words_after_double_dash_and_needs_config(tmp_path):
  def sweep_py(*args):
    return subprocess.run([sys.executable, "scripts/sweep.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)

  result = sweep_py(f"--config={CONFIG}", f"--workdir={tmp_path}", "--dry-run", "--",
                    "--config.steps=2")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert len(lines) == 9 and all(line.endswith(" --config.steps=2") for line in lines)
  result = sweep_py(f"--workdir={tmp_path}")
  assert result.returncode != 0 and "--config" in result.stderr
  assert "--slurm_file" in sweep_py("--help").stdout  # absl lists the script's own flags.


def test_a_config_without_sweep_is_an_error(tmp_path):
  path = tmp_path / "grpo_nosweep.py"
  path.write_text("def get_config(arg=None):\n  return None\n")
  with pytest.raises(ValueError, match="defines no sweep"):
    sweep.commands(str(path), "/tmp/x")


# ---- launch scripts ----


@pytest.mark.parametrize("script", ["launch_tpu_pod.sh", "launch_slurm.sh"])
def test_launch_scripts_parse_and_document_their_usage(script):
  assert _bash("-n", f"scripts/{script}").returncode == 0
  result = _bash(f"scripts/{script}", "--help")
  assert result.returncode == 0 and "Usage" in result.stdout
  assert _bash(f"scripts/{script}").returncode == 2  # no command: usage, exit 2


def test_tpu_pod_launch_runs_the_same_command_on_all_workers():
  result = _bash("scripts/launch_tpu_pod.sh", "--zone=us-east5-a", "--dry-run", "my-pod", "--",
                 "python", "experiments/grpo.py", "--workdir=gs://b/run 1")
  assert result.returncode == 0, result.stderr
  line = result.stdout.strip()
  assert line.startswith("gcloud compute tpus tpu-vm ssh my-pod --worker=all --zone=us-east5-a")
  assert "JAXRL_POST_DISTRIBUTED=1" in line and "experiments/grpo.py" in line


def test_slurm_launch_outer_call_starts_one_task_per_gpu():
  env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_PER_NODE": "h100:8"}
  result = _bash("scripts/launch_slurm.sh", "--per=gpu", "--dry-run", "--", "python", "x.py",
                 env=env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("srun --nodes=2 --ntasks-per-node=8 ")
  assert "--port=12587" in result.stdout  # 12345 + 4242 % 1000
  result = _bash("scripts/launch_slurm.sh", "--", "true", env={"SLURM_JOB_ID": ""})
  assert result.returncode == 2 and "not inside a SLURM allocation" in result.stderr


def test_slurm_launch_task_sets_the_distributed_environment():
  env = {"JAXRL_POST_SLURM_TASK": "1", "SLURM_JOB_ID": "1", "SLURM_NTASKS": "16",
         "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-08,11],cpu3",
         "PATH": "/usr/bin:/bin"}  # no scontrol: the node list is parsed in bash
  result = _bash("scripts/launch_slurm.sh", "--per=gpu", "--port=2222", "--dry-run", "--",
                 "python", "x.py", env=env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[:4] == [
    "JAX_COORDINATOR_ADDRESS=gpu07:2222", "JAX_LOCAL_DEVICE_IDS=1", "JAX_NUM_PROCESSES=16",
    "JAX_PROCESS_ID=9"]


_PROGRAM = """
import jax, jax.numpy as jnp, numpy as np
from jaxrl_post.parallel import mesh as m
assert m.maybe_initialize_distributed()
config = m.mesh_config(ici=dict(fsdp=-1), dcn=dict(data=-1), num_slices=2)
mesh = m.make_mesh(config)
rows = np.full((1, 4), jax.process_index() + 1.0)
x = jax.make_array_from_process_local_data(m.batch_sharding(mesh, ndim=2), rows)
count = int(m.global_token_count(x > 0, mesh))
print("RESULT", jax.process_count(), jax.process_index(), dict(mesh.shape), count,
      float(jax.jit(jnp.sum)(x)))
"""


def test_two_processes_started_like_slurm_tasks_form_one_mesh():
  # Two localhost processes, one CPU device each, joined by jax.distributed
  # through the environment launch_slurm.sh sets; each process is a "slice".
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = []
  for rank in range(2):
    env = {**os.environ, "JAXRL_POST_SLURM_TASK": "1", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank),
           "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    procs.append(subprocess.Popen(
      ["bash", "scripts/launch_slurm.sh", f"--port={port}", "--", sys.executable, "-c",
       _PROGRAM], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outputs = []
  for proc in procs:
    try:
      out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise
    assert proc.returncode == 0, err[-3000:]
    outputs.append([line for line in out.splitlines() if line.startswith("RESULT")][0])
  # 4 tokens per process, summed over both; values 1·4 + 2·4.
  assert outputs == [f"RESULT 2 {rank} {{'data': 2, 'fsdp': 1, 'tensor': 1}} 8 12.0"
                     for rank in range(2)]
