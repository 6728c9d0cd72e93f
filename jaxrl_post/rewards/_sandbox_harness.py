"""Vetting harness: runs inside `sandbox.run_sandboxed` (never imported by the package).

Reads `{"nonce", "modules": [{"key", "code", "function"}], "features": {name: shape}, "batch",
"seed"}` from stdin. For each module it prints `<nonce> {"event": "start", "key"}`, then compiles
the (already allow-listed) code with no usable builtins and `jnp` as the only global, traces it (as
`jax.jit` would) and runs it on standard-normal and on all-zero features `[batch, *shape]`, and
prints
`<nonce> {"event": "result", "key", "ok", "reason"}`. A module passes if both calls return a
finite floating array of shape `[batch]`.
"""

import json
import sys


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
  rng = np.random.default_rng(int(payload["seed"]))
  shapes = {k: tuple(v) for k, v in payload["features"].items()}
  samples = [
      ("random", {k: rng.standard_normal((batch,) + s).astype(np.float32)
                  for k, s in shapes.items()}),
      ("zero", {k: np.zeros((batch,) + s, np.float32) for k, s in shapes.items()}),
  ]
  def loaded_only_import(name, globals=None, locals=None, fromlist=(), level=0):
    # Same as module_code.loaded_only_import: C code in jaxlib calls PyImport_Import from the
    # module's frame; serve loaded modules only.
    module = sys.modules.get(name) if level == 0 else None
    if module is None:
      raise ImportError(f"import of {name!r} is not allowed in reward modules")
    return module if fromlist else sys.modules[name.partition(".")[0]]

  for module in payload["modules"]:
    emit(event="start", key=module["key"])
    ok, reason = True, ""
    try:
      namespace = {"__builtins__": {"__import__": loaded_only_import}, "jnp": jnp}
      exec(compile(module["code"], "<reward module>", "exec"), namespace)  # noqa: S102
      fn = namespace[module["function"]]
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
    except BaseException as e:  # noqa: BLE001 - every failure is a verdict, the run continues.
      if isinstance(e, KeyboardInterrupt):
        raise
      ok, reason = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
    emit(event="result", key=module["key"], ok=ok, reason=reason)


if __name__ == "__main__":
  main()
