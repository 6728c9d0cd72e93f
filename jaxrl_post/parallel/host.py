"""One single-threaded XLA:CPU device per core, so a CPU host runs data parallel.

XLA:CPU parallelises *inside* an op with an Eigen thread pool, which pays off
for large matrices only. A decode step of a small model is a chain of small
products (`[64, 256] · [256, 768]`) and elementwise ops: on our 2-core machine
the `small` decode loop ran 11.6 ms per step with both cores and 13.7 ms with
one, so the second core bought 15 %. Splitting the host into one device per
core and sharding the batch over them (the sampler's `mesh` argument) runs
the halves side by side: 6.9 ms per step (docs/benchmarks.md). Each device
then runs its ops on its own thread, so the intra-op pool is switched off;
otherwise the two devices' pools compete for the same cores.

This is the CPU analogue of data parallelism over accelerators and uses the
same code path; it only has to be set up before JAX starts its CPU backend.
"""

from __future__ import annotations

import os

import jax
from jax._src import xla_bridge
from jax.sharding import Mesh

from jaxrl_post.parallel import mesh as mesh_lib

_SINGLE_THREAD_FLAG = "--xla_cpu_multi_thread_eigen=false"


def usable_cores() -> int:
  """The cores this process may run on (`os.sched_getaffinity` where available)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def use_one_cpu_device_per_core(num_devices: int | None = None) -> int:
  """Makes the CPU backend start with `num_devices` single-threaded devices.

  Call it before the first JAX computation of the process (argument parsing
  and imports are fine). It does not touch GPU/TPU backends.

  Args:
    num_devices: devices to create; default `os.cpu_count()` (the cores this
      process may use, `os.sched_getaffinity`, where available).

  Returns:
    The number of CPU devices the backend will have.

  Raises:
    RuntimeError: JAX's backends are already initialised, so the device count
      can no longer change.
    ValueError: `num_devices < 1`.
  """
  if num_devices is None:
    num_devices = usable_cores()
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1, got {num_devices}")
  if xla_bridge.backends_are_initialized():
    raise RuntimeError(
      "use_one_cpu_device_per_core() must run before the first JAX computation: the CPU "
      f"backend already exists with {jax.local_device_count('cpu')} device(s)")
  jax.config.update("jax_num_cpu_devices", num_devices)
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_cpu_multi_thread_eigen" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_SINGLE_THREAD_FLAG}".strip()
  return num_devices


def configure_cpu_devices(num_devices: int, *, key: str = "config.mesh.cpu_devices") -> int:
  """Applies a config's CPU layout before JAX starts: `use_one_cpu_device_per_core`.

  `num_devices`: 0 keeps XLA's default (one device whose thread pool spans the
  cores), -1 makes one single-threaded device per core, n > 0 makes n. When the
  CPU backend already exists (a second run in one process) it must already have
  that layout, or the config key is named in the error.

  Returns:
    The number of CPU devices (0 for XLA's default layout).

  Raises:
    ValueError: `num_devices < -1`, or a backend that already started with another layout.
  """
  if num_devices < -1:
    raise ValueError(f"{key}={num_devices}: use 0 (XLA's default), -1 (one device per core) "
                     "or a device count")
  if num_devices == 0:
    return 0
  wanted = num_devices if num_devices > 0 else usable_cores()
  if not xla_bridge.backends_are_initialized():
    return use_one_cpu_device_per_core(wanted)
  have = jax.local_device_count("cpu")
  single = _SINGLE_THREAD_FLAG in os.environ.get("XLA_FLAGS", "")
  if have != wanted or not single:
    raise ValueError(
      f"{key}={num_devices} asks for {wanted} single-threaded CPU device(s), but JAX's CPU "
      f"backend already started with {have} device(s)"
      f"{'' if single else ' and its thread pool'}: set it before the process's first JAX "
      f"computation, or use {key}=0")
  return wanted


def data_mesh(devices=None) -> Mesh:
  """A `("data", "fsdp", "tensor")` mesh with every device on `data` (pure data parallelism).

  `mesh.make_mesh` of the default `mesh_config` with `ici_data=-1`; the other
  axes have size 1, so rule tables that name them still apply.
  """
  return mesh_lib.make_mesh(mesh_lib.mesh_config(ici={"data": -1}), devices=devices)
