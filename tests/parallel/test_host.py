"""One single-threaded CPU device per core: set up in a fresh process, refused after start."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxrl_post.parallel import host

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
