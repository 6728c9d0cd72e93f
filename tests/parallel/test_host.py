"""One single-threaded CPU device per core: set up in a fresh process, refused after start."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from runlocal_helpers import run_binary, subprocess_env

from jaxrl_post.parallel import host

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import os, jax
from jaxrl_post.parallel import host
n = host.use_one_cpu_device_per_core({n})
print(n, jax.device_count(), jax.devices()[0].platform, os.environ["XLA_FLAGS"])
"""


def _child(n):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _CHILD.format(n=n)], capture_output=True,
                          text=True, timeout=120, check=False, env=env)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout.split()


def test_splits_the_host_into_single_threaded_devices():
  requested, count, platform, flags = _child(3)
  assert (requested, count, platform) == ("3", "3", "cpu")
  assert flags == "--xla_cpu_multi_thread_eigen=false"


def test_default_is_one_device_per_usable_core():
  requested, count, _, _ = _child(None)
  assert requested == count == str(len(os.sched_getaffinity(0)))


def test_refuses_once_the_backend_exists():
  jax.devices()  # the test session's backend (8 fake devices) is up
  with pytest.raises(RuntimeError, match="before the first JAX computation"):
    host.use_one_cpu_device_per_core(2)


def test_rejects_a_non_positive_count():
  with pytest.raises(ValueError, match="num_devices must be >= 1"):
    host.use_one_cpu_device_per_core(0)


def test_data_mesh_puts_every_device_on_the_first_axis():
  mesh = host.data_mesh(jax.devices()[:4])
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 1}
  np.testing.assert_array_equal(mesh.devices.ravel(), np.asarray(jax.devices()[:4]))


def test_configure_cpu_devices_keeps_the_default_at_zero_and_names_the_key():
  assert host.configure_cpu_devices(0) == 0
  with pytest.raises(ValueError, match=r"config.mesh.cpu_devices=-2"):
    host.configure_cpu_devices(-2)
  jax.devices()  # the session's backend: 8 multi-threaded fake devices
  with pytest.raises(ValueError, match=r"config.mesh.cpu_devices=2 asks for 2 .* already started"):
    host.configure_cpu_devices(2)


def test_a_binary_runs_on_one_device_per_core(tmp_path):
  """`config.mesh.cpu_devices=2` with the devices on `data`: the loop sets the layout up before
  JAX starts, and the step's rows go over both devices."""
  result = run_binary("grpo.py", str(ROOT / "configs" / "grpo_arith.py:runlocal"),
                      tmp_path / "run", subprocess_env(tmp_path / "cache"), "--config.steps=2",
                      "--config.mesh.cpu_devices=2", "--config.mesh.ici_data=-1",
                      "--config.mesh.ici_fsdp=1")
  assert "trainer mesh {'data': 2, 'fsdp': 1, 'tensor': 1}" in result.stderr
