"""Timing helpers shared by `scripts/bench_*.py`: median wall clock and a matmul peak.

Every benchmark reports its throughput against a reference measured in the
same process (a dense float matmul), so numbers from different machines, or
from one machine under different load, can be compared as fractions.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int = 3) -> float:
  """Median wall clock of `fn()` over `repeats` calls, after one untimed warm-up call.

  `fn` must block until its work is done (`jax.block_until_ready`).
  """
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def matmul_peak(n: int = 2048, dtype: str = "float32", repeats: int = 3) -> dict:
  """FLOP/s of a jitted `[n, n] @ [n, n]` on the default device: the reference for MFU."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  matmul = jax.jit(lambda a: a @ a)
  seconds = median_seconds(lambda: matmul(a).block_until_ready(), repeats)
  return {"what": "matmul_peak", "n": n, "dtype": dtype, "seconds": seconds,
          "flops_per_s": 2 * n**3 / seconds, "tflops": 2 * n**3 / seconds / 1e12,
          "backend": jax.default_backend(), "devices": len(jax.devices())}
