"""Test-session setup: a fake 8-device CPU host, set before JAX is imported."""

import os

# Sharding tests need several devices; on CPU XLA can pretend to have them.
# This must run before the first `import jax` of the session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
