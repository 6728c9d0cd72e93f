"""Test-session setup: a fake 8-device CPU host and a shared persistent XLA cache, set before
JAX is imported."""

import os
import tempfile

# Sharding tests need several devices; on CPU XLA can pretend to have them.
# This must run before the first `import jax` of the session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

# The suite compiles the same small programs many times (a straight run and its resumed twin,
# the runlocal configs of one model, subprocess binaries), and on 2 CPU cores compilation is
# most of its time. JAX's persistent cache returns the executable XLA would build, so results
# do not change; the xdist workers and the binaries the tests launch inherit the variables and
# share one directory (the size bound turns on JAX's file lock). Programs that compile in
# under 0.2 s are not worth a disk round trip.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
  tempfile.gettempdir(), f"jaxrl_post_tests_xla_cache_{os.getuid()}"))
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


# Imported after the flags above, which must come before JAX's first import.
import pytest  # noqa: E402

STANDIN_REPO = "Qwen/Qwen3-0.6B"  # the name the stand-in is staged under in `staged_hub`


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
  """A reduced random Qwen3 checkpoint shaped like a Hub repository (`jaxrl_post.standin`);
  read-only for the tests that share it."""
  from jaxrl_post.standin import write_standin_checkpoint

  return write_standin_checkpoint(tmp_path_factory.mktemp("standin") / "qwen3")


@pytest.fixture(scope="session")
def staged_hub(tmp_path_factory, standin):
  """A Hub cache holding the stand-in as `STANDIN_REPO` (main = commit 000…0):
  `(cache_dir, snapshot_dir)`."""
  from jaxrl_post.standin import stage_in_hub_cache

  cache_dir = tmp_path_factory.mktemp("hub")
  return cache_dir, stage_in_hub_cache(standin, STANDIN_REPO, cache_dir=cache_dir)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's in-memory compilation caches after each test module.

  Every executable XLA's CPU backend keeps alive holds its own memory mappings, and an xdist
  worker runs about 1,300 tests: measured single-process, 385 tests of tests/losses and
  tests/training left 15,500 mappings, and a CI worker reached the kernel's vm.max_map_count
  (65,530), where LLVM fails with "Failed to materialize symbols ... Cannot allocate memory".
  After clearing, each module starts from about 1,200. Programs shared across modules come
  back from the persistent cache above, so this costs little time.
  """
  yield
  import gc

  import jax

  jax.clear_caches()
  gc.collect()
