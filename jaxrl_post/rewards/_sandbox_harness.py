"""Vetting harness: runs inside `sandbox.run_sandboxed` (never imported by the package).

Reads `{"nonce", "modules": [{"key", "code", "function"}], "features": {name: shape}, "batch",
"seed", "eval_batch", "max_growth", "growth_floor", "max_bytes_per_sample",
"max_flops_per_sample"}` from stdin. For each module it prints `<nonce> {"event": "start", "key"}`,
compiles the (already allow-listed) code with no usable builtins and `jnp` as the only global,
and runs three checks, cheapest first, each on abstract inputs until the last:

1. growth (stage "growth"): `jax.make_jaxpr` at batch 1 and at `eval_batch` with
   `jax.ShapeDtypeStruct` features (nothing materialised); every equation output and constant of
   the jaxpr, sub-jaxprs included, may hold at most `L · batch` elements, with
   `L = max(max_growth · d_max, growth_floor)` and `d_max` the largest per-sample feature size.
   Batch 1 catches per-sample growth and batch-independent giants; `eval_batch` catches
   intermediates that grow with the batch squared (e.g. `jnp.dot` of two batched arrays). It
   runs before any XLA compile because compiling a huge fused op can itself exhaust memory.
2. cost (stage "cost"): `jax.jit(fn).lower(...).compile()` at `eval_batch`, then
   `memory_analysis()` (argument + output + temp bytes) and `cost_analysis()` (flops) divided by
   `eval_batch` against the per-sample budgets.
3. test-run (stage "test-run"): traced and run on standard-normal and all-zero features
   `[batch, *shape]`; both calls must return a finite floating array of shape `[batch]`.

Then it prints `<nonce> {"event": "result", "key", "ok", "reason", "stage", "cost"}` with `cost`
the measured numbers (`{"growth_elems_per_sample", "bytes_per_sample", "flops_per_sample",
"bytes_accessed_per_sample"}`, as far as measured).
"""

import json
import math
import sys


class BudgetExceeded(Exception):
  """A module is over a growth / cost budget; `stage` says which check."""

  def __init__(self, stage, message):
    super().__init__(message)
    self.stage = stage


def sub_jaxprs(params):
  """The (closed) jaxprs held in an equation's params (pjit, cond branches, scan bodies...)."""
  for p in params.values():
    for sub in (p if isinstance(p, (tuple, list)) else (p,)):
      if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
        yield sub


def largest_intermediate(closed):
  """(elements, primitive name, aval string) of the largest array a jaxpr creates."""
  best = (0, "", "")
  jaxpr = closed.jaxpr if hasattr(getattr(closed, "jaxpr", None), "eqns") else closed
  named = [("constant", v.aval) for v in jaxpr.constvars]
  for eqn in jaxpr.eqns:
    named += [(eqn.primitive.name, v.aval) for v in eqn.outvars]
    for sub in sub_jaxprs(eqn.params):
      best = max(best, largest_intermediate(sub))
  for name, aval in named:
    shape = getattr(aval, "shape", None)
    if shape is not None:
      best = max(best, (math.prod(shape), name, str(aval)))
  return best


def main():
  payload = json.loads(sys.stdin.read())
  nonce = payload["nonce"]

  def emit(**msg):
    sys.stdout.write(nonce + " " + json.dumps(msg) + "\n")
    sys.stdout.flush()

  import jax
  import jax.numpy as jnp
  import numpy as np

  sys.audit("jaxrl_post.sandbox.arm")  # Trusted imports done: ban ctypes from here on.
  batch = int(payload["batch"])
  eval_batch = int(payload["eval_batch"])
  rng = np.random.default_rng(int(payload["seed"]))
  shapes = {k: tuple(v) for k, v in payload["features"].items()}
  d_max = max([math.prod(s) for s in shapes.values()] + [1])
  growth_limit = max(int(payload["max_growth"]) * d_max, int(payload["growth_floor"]))
  max_bytes = float(payload["max_bytes_per_sample"])
  max_flops = float(payload["max_flops_per_sample"])
  samples = [
      ("random", {k: rng.standard_normal((batch,) + s).astype(np.float32)
                  for k, s in shapes.items()}),
      ("zero", {k: np.zeros((batch,) + s, np.float32) for k, s in shapes.items()}),
  ]

  def abstract(b):
    return {k: jax.ShapeDtypeStruct((b,) + s, jnp.float32) for k, s in shapes.items()}

  def loaded_only_import(name, globals=None, locals=None, fromlist=(), level=0):
    # Same as module_code.loaded_only_import: C code in jaxlib calls PyImport_Import from the
    # module's frame; serve loaded modules only.
    module = sys.modules.get(name) if level == 0 else None
    if module is None:
      raise ImportError(f"import of {name!r} is not allowed in reward modules")
    return module if fromlist else sys.modules[name.partition(".")[0]]

  def check_growth(fn, cost):
    for b in (1, eval_batch):
      closed = jax.make_jaxpr(fn)(abstract(b))
      out_avals = closed.out_avals
      if len(out_avals) != 1:
        raise TypeError(f"returned {len(out_avals)} arrays, need one")
      if tuple(out_avals[0].shape) != (b,):
        raise ValueError(f"output shape {tuple(out_avals[0].shape)} at batch {b}; need ({b},)")
      elems, prim, aval = largest_intermediate(closed)
      per_sample = elems / b
      cost["growth_elems_per_sample"] = max(cost.get("growth_elems_per_sample", 0), per_sample)
      if per_sample > growth_limit:
        raise BudgetExceeded("growth", (
            f"growth: `{prim}` makes {aval} at batch {b}, {per_sample:.0f} elements per sample "
            f"> limit {growth_limit} (VetConfig.max_growth={payload['max_growth']} x largest "
            f"feature {d_max} elements, floor VetConfig.growth_floor={payload['growth_floor']})"))

  def check_cost(fn, cost):
    compiled = jax.jit(fn).lower(abstract(eval_batch)).compile()
    mem = compiled.memory_analysis()
    parts = {k: int(getattr(mem, k + "_size_in_bytes", 0) or 0)
             for k in ("argument", "output", "temp")} if mem is not None else {}
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    flops = float(analysis.get("flops", 0.0)) + float(analysis.get("transcendentals", 0.0))
    cost["bytes_per_sample"] = sum(parts.values()) / eval_batch
    cost["flops_per_sample"] = flops / eval_batch
    cost["bytes_accessed_per_sample"] = float(analysis.get("bytes accessed", 0.0)) / eval_batch
    if cost["bytes_per_sample"] > max_bytes:
      detail = " + ".join(f"{k} {v}" for k, v in parts.items())
      raise BudgetExceeded("cost", (
          f"cost: {cost['bytes_per_sample']:.0f} bytes per sample at batch {eval_batch} "
          f"({detail} bytes) > budget VetConfig.max_bytes_per_sample={max_bytes:.0f}"))
    if cost["flops_per_sample"] > max_flops:
      raise BudgetExceeded("cost", (
          f"cost: {cost['flops_per_sample']:.0f} flops per sample at batch {eval_batch} "
          f"> budget VetConfig.max_flops_per_sample={max_flops:.0f}"))

  for module in payload["modules"]:
    emit(event="start", key=module["key"])
    ok, reason, stage, cost = True, "", "ok", {}
    try:
      namespace = {"__builtins__": {"__import__": loaded_only_import}, "jnp": jnp}
      exec(compile(module["code"], "<reward module>", "exec"), namespace)  # noqa: S102
      fn = namespace[module["function"]]
      check_growth(fn, cost)
      check_cost(fn, cost)
      for what, feats in samples:
        # Tracing proves the module works under jit (no Python on traced values, static
        # shapes); the values come from eager execution, whose per-op compiles are cached across
        # modules, instead of one XLA compile per module.
        out_avals = jax.make_jaxpr(fn)(feats).out_avals
        if len(out_avals) != 1:
          raise TypeError(f"returned {len(out_avals)} arrays, need one")
        out = fn(feats)
        if not hasattr(out, "shape") or not hasattr(out, "dtype"):
          raise TypeError(f"returned {type(out).__name__}, not an array")
        out = np.asarray(out)
        if out.shape != (batch,):
          raise ValueError(f"output shape {out.shape} on {what} features; need ({batch},)")
        if not np.issubdtype(out.dtype, np.floating):
          raise TypeError(f"output dtype {out.dtype}; need a floating dtype")
        if not np.all(np.isfinite(out)):
          raise ValueError(f"non-finite output on {what} features")
    except BudgetExceeded as e:
      ok, reason, stage = False, str(e)[:400], e.stage
    except BaseException as e:  # noqa: BLE001 - every failure is a verdict, the run continues.
      if isinstance(e, KeyboardInterrupt):
        raise
      ok, stage = False, "test-run"
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
    emit(event="result", key=module["key"], ok=ok, reason=reason, stage=stage, cost=cost)


if __name__ == "__main__":
  main()
