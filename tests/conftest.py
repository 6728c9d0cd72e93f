"""Test-session setup: a fake 8-device CPU host, set before JAX is imported."""

import os

# Sharding tests need several devices; on CPU XLA can pretend to have them.
# This must run before the first `import jax` of the session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()


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
