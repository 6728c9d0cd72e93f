"""Separate-process test-runs of proposed reward-module code (MLREF, arXiv 2608.18827).

Proposed module code never runs unvetted in the trainer's process. `vet_modules` first checks the
code statically (`module_code.validate_module_code`, an AST allow-list), then, in a child process
under `run_sandboxed` (`_sandbox_harness.py`), bounds what it *costs per sample* at the trainer's
batch before running it at all, and finally test-runs it:

1. growth: the jaxpr at batch 1 and at `VetConfig.eval_batch` (abstract inputs, nothing
   materialised) may not hold an array of more than `L` elements per sample,
   `L = max(max_growth · d_max, growth_floor)` with `d_max` the largest per-sample feature size;
2. cost: XLA's `memory_analysis()` (argument + output + temp bytes) and `cost_analysis()` (flops)
   of the module compiled for `eval_batch`, per sample, against `max_bytes_per_sample` and
   `max_flops_per_sample`;
3. test-run: `jax.jit` semantics on random and all-zero features `[VetConfig.batch, *shape]`,
   requiring a finite float output of shape `[batch]`.

Only code that passes every gate may enter the pool; everything else comes back as a rejected
`Verdict` whose reason names the measured value and the budget. Why (1) and (2): the allow-list
bounds the *shape* of the output, not the work in between: a 23-line module that doubles an `(8,)`
feature 20 times with `jnp.concatenate` and sums it back passes a test-run at batch 4 (128 MB) and
then needs 64 GB at the trainer's batch of 2,048, and such an out-of-memory abort
(`std::bad_alloc`) kills the trainer's process: it cannot be caught there, only prevented here.

`run_sandboxed` runs a Python program in a fresh temporary directory with (see
`_sandbox_boot.py` for the details and the reasons):

* limits: CPU seconds, address space, file size, open files (rlimits, soft = hard), wall clock
  (the whole process group is SIGKILLed), captured output capped;
* no network: a new network namespace (kernel-enforced) where available, plus an audit hook that
  refuses sockets;
* no writes outside the temporary directory: every mount read-only except that directory (mount
  namespace) where available, plus the audit hook; the directory is deleted afterwards;
* no processes: an audit hook refuses process creation; a PID namespace hides all others;
* a minimal environment (no API keys, `HOME`/`TMPDIR` in the temporary directory, CPU-only JAX).

`namespaces="auto"` uses the namespaces when the kernel allows them and falls back to rlimits +
audit hook otherwise (see `isolation_layers`); `"require"` fails instead of falling back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Literal, Mapping, MutableMapping, Sequence

from jaxrl_post.rewards import module_code

_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_boot.py")
_HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_harness.py")
Namespaces = Literal["auto", "require", "off"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxLimits:
  """Per-process limits of one sandboxed run.

  Attributes:
    cpu_s: CPU seconds, all threads together (RLIMIT_CPU; SIGKILL at the limit).
    wall_s: wall-clock seconds before the process group is killed.
    memory_bytes: address-space limit (RLIMIT_AS). JAX on CPU needs ~2 GiB of address space just
      to start, so keep this ≥ 3 GiB for programs that import JAX.
    file_bytes: largest file the child may write (RLIMIT_FSIZE).
    open_files: open file descriptors (RLIMIT_NOFILE).
    output_bytes: stdout / stderr kept per stream; the rest is read and dropped.
  """
  cpu_s: float = 60.0
  wall_s: float = 60.0
  memory_bytes: int = 4 << 30
  file_bytes: int = 16 << 20
  open_files: int = 256
  output_bytes: int = 1 << 20


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """Outcome of `run_sandboxed`.

  Attributes:
    returncode: exit status (negative: killed by that signal).
    stdout: captured stdout (capped, UTF-8 with replacement).
    stderr: captured stderr (capped).
    timed_out: the wall-clock limit was hit.
    wall_s: wall-clock seconds.
    cpu_s: CPU seconds of the program when known (PID-namespace runs), else None.
    layers: isolation layers that were in force, e.g. ("rlimits", "netns", "pidns",
      "readonly_fs", "audit_hook"); empty if the child died before reporting.
    error: a sandbox set-up failure, if any.
  """
  returncode: int
  stdout: str
  stderr: str
  timed_out: bool
  wall_s: float
  cpu_s: float | None
  layers: tuple[str, ...]
  error: str | None = None

  @property
  def ok(self) -> bool:
    return self.returncode == 0 and not self.timed_out and self.error is None

  def describe(self, limits: SandboxLimits | None = None) -> str:
    """A short reason for a failed run (timeout / CPU / memory / signal / exit code)."""
    if self.error:
      return f"sandbox error: {self.error}"
    if self.timed_out:
      return f"wall-clock limit exceeded ({self.wall_s:.1f} s)"
    if self.returncode < 0:
      sig = -self.returncode
      name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
      if limits is not None and self.cpu_s is not None and self.cpu_s >= limits.cpu_s - 0.5:
        return f"CPU-time limit exceeded ({self.cpu_s:.1f} s)"
      if sig in (signal.SIGKILL, signal.SIGXCPU):
        return f"killed by {name} (CPU-time or memory limit)"
      return f"killed by {name}"
    tail = self.stderr.strip().splitlines()[-1:] or [""]
    return f"exit status {self.returncode}: {tail[0][:300]}"


def _read_capped(stream, cap: int, out: list, on_line=None):
  """Reads a pipe to EOF, keeping the first `cap` bytes (a chatty child cannot fill our RAM).

  `on_line(str)` is called for each complete line within the cap, as it arrives.
  """
  kept, size, partial = [], 0, b""
  while True:
    chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
    if not chunk:
      break
    if size < cap:
      kept.append(chunk[:cap - size])
      size += len(kept[-1])
      if on_line is not None:
        partial += kept[-1]
        *lines, partial = partial.split(b"\n")
        for line in lines:
          on_line(line.decode("utf-8", "replace"))
  out.append(b"".join(kept))


def _child_env(box: str) -> dict[str, str]:
  # Built from scratch: the trainer's environment (API keys, credentials) never reaches the child.
  return {
      "PATH": "/usr/bin:/bin",
      "HOME": box,
      "TMPDIR": box,
      "LANG": "C.UTF-8",
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
      "OMP_NUM_THREADS": "1",
      "OPENBLAS_NUM_THREADS": "1",
      "TF_CPP_MIN_LOG_LEVEL": "3",
      "PYTHONHASHSEED": "0",
  }


def run_sandboxed(program: str, *, stdin: str | bytes = b"",
                  limits: SandboxLimits = SandboxLimits(), namespaces: Namespaces = "auto",
                  root: str | os.PathLike | None = None, arm_later: bool = False,
                  audit_hook: bool = True,
                  watchdog: Callable[[str], float | None] | None = None,
                  initial_deadline_s: float | None = None) -> SandboxResult:
  """Runs the Python source `program` in a confined child process (see the module docstring).

  Args:
    program: Python source, run as `__main__` in a fresh temporary directory (its cwd).
    stdin: bytes (or str, UTF-8) for the child's stdin.
    limits: `SandboxLimits`.
    namespaces: "auto" (use Linux namespaces if possible), "require" or "off".
    root: where to create the temporary directory (default: the system temp dir). It is removed
      afterwards in all cases.
    arm_later: trusted programs (the vetting harness) import JAX first and then arm the ctypes
      ban with `sys.audit("jaxrl_post.sandbox.arm")`; untrusted code is armed from the start.
    audit_hook: False leaves out the audit hook; only for tests of the kernel layers alone.
    watchdog: called with each stdout line as it arrives; a float return value moves the
      wall-clock deadline to that many seconds from now (never beyond `limits.wall_s` in total).
    initial_deadline_s: wall-clock deadline until the watchdog first moves it (default
      `limits.wall_s`).

  Returns:
    `SandboxResult`.
  """
  if namespaces not in ("auto", "require", "off"):
    raise ValueError(f"namespaces must be 'auto', 'require' or 'off', got {namespaces!r}")
  if isinstance(stdin, str):
    stdin = stdin.encode()
  kwargs = dict(stdin=stdin, limits=limits, root=root, arm_later=arm_later,
                audit_hook=audit_hook, watchdog=watchdog, initial_deadline_s=initial_deadline_s)
  if namespaces == "auto" and _NAMESPACES_BROKEN:
    namespaces = "off"
  res = _run_once(program, namespaces=namespaces, **kwargs)
  if namespaces == "auto" and res.error and "confinement failed" in res.error:
    # The kernel let us create namespaces but not mount in them (e.g. an LSM restricting user
    # namespaces): remember it and fall back to rlimits + audit hook.
    _NAMESPACES_BROKEN.append(res.error)
    res = _run_once(program, namespaces="off", **kwargs)
  return res


_NAMESPACES_BROKEN: list[str] = []


def _run_once(program: str, *, stdin: bytes, limits: SandboxLimits, namespaces: Namespaces,
              root, arm_later: bool, audit_hook: bool, watchdog, initial_deadline_s
              ) -> SandboxResult:
  """One sandboxed run (see `run_sandboxed`)."""
  box = os.path.realpath(tempfile.mkdtemp(prefix="jaxrl_sandbox_", dir=root))
  try:
    os.chmod(box, 0o700)
    prog_path = os.path.join(box, "program.py")
    with open(prog_path, "w") as f:
      f.write(program)
    cfg = {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
           "file_bytes": limits.file_bytes, "open_files": limits.open_files,
           "namespaces": namespaces, "arm_later": arm_later, "audit_hook": audit_hook}
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
      proc = subprocess.Popen(
          [sys.executable, "-I", "-B", _BOOT, box, prog_path, json.dumps(cfg), str(status_w)],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          pass_fds=(status_w,), cwd=box, env=_child_env(box), start_new_session=True)
    finally:
      os.close(status_w)
    outs: dict[str, list] = {"stdout": [], "stderr": [], "status": []}
    hard_deadline = start + limits.wall_s
    deadline = [hard_deadline if initial_deadline_s is None else
                min(hard_deadline, start + initial_deadline_s)]

    def on_line(line):
      extend = watchdog(line)
      if extend is not None:
        deadline[0] = min(hard_deadline, time.monotonic() + extend)

    readers = [
        threading.Thread(target=_read_capped,
                         args=(proc.stdout, limits.output_bytes, outs["stdout"],
                               on_line if watchdog else None), daemon=True),
        threading.Thread(target=_read_capped, args=(proc.stderr, limits.output_bytes,
                                                    outs["stderr"]), daemon=True),
        threading.Thread(target=_read_capped, args=(os.fdopen(status_r, "rb"), 1 << 16,
                                                    outs["status"]), daemon=True),
    ]
    for t in readers:
      t.start()
    try:
      proc.stdin.write(stdin)
    except (BrokenPipeError, OSError):
      pass  # The child exited or does not read stdin.
    finally:
      try:
        proc.stdin.close()
      except OSError:
        pass
    timed_out = False
    # Wait *without reaping* (WNOWAIT): while the child is an unreaped zombie its process-group
    # id cannot be reused, so the killpg below can only hit processes this run started.
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
      if time.monotonic() >= deadline[0]:
        timed_out = True
        break
      time.sleep(0.02)
    # Kill the whole group in every case: a finished child may have left background processes.
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    proc.wait()
    wall = time.monotonic() - start
    for t in readers:
      t.join(timeout=10)
    status = _parse_status(outs["status"][0] if outs["status"] else b"")
    return SandboxResult(
        returncode=proc.returncode,
        stdout=(outs["stdout"] or [b""])[0].decode("utf-8", "replace"),
        stderr=(outs["stderr"] or [b""])[0].decode("utf-8", "replace"),
        timed_out=timed_out, wall_s=wall, cpu_s=status.get("cpu_s"),
        layers=tuple(status.get("layers", ())), error=status.get("error"))
  finally:
    shutil.rmtree(box, ignore_errors=True)


def _parse_status(raw: bytes) -> dict:
  status: dict = {}
  for line in raw.decode("utf-8", "replace").splitlines():
    try:
      status.update(json.loads(line))
    except json.JSONDecodeError:
      continue
  return status


_LAYERS_CACHE: dict[str, tuple[str, ...]] = {}


def isolation_layers(namespaces: Namespaces = "auto", *,
                     root: str | os.PathLike | None = None) -> tuple[str, ...]:
  """The isolation layers a sandboxed run gets on this machine (probed once, then cached)."""
  if namespaces not in _LAYERS_CACHE:
    res = run_sandboxed("pass", namespaces=namespaces, root=root,
                        limits=SandboxLimits(cpu_s=10, wall_s=30, memory_bytes=1 << 30))
    _LAYERS_CACHE[namespaces] = res.layers
  return _LAYERS_CACHE[namespaces]


# ---------------------------------------------------------------------------------------------
# Vetting reward modules.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
  """Outcome of vetting one piece of module code.

  Attributes:
    ok: the code may enter the pool.
    reason: why it was rejected ("" when ok).
    stage: "validate" (static allow-list), "growth" (an intermediate too large per sample),
      "cost" (compiled bytes / flops per sample over budget), "test-run" (sandboxed execution)
      or "ok".
    cost: what the sandbox measured, as far as it got: "growth_elems_per_sample" (largest
      intermediate), "bytes_per_sample", "flops_per_sample", "bytes_accessed_per_sample" (at
      `VetConfig.eval_batch`); empty for verdicts from the static check.
  """
  ok: bool
  reason: str = ""
  stage: str = "ok"
  cost: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return {"ok": self.ok, "reason": self.reason, "stage": self.stage, "cost": dict(self.cost)}

  @classmethod
  def from_json(cls, d: Mapping) -> Verdict:
    return cls(bool(d["ok"]), str(d.get("reason", "")), str(d.get("stage", "ok")),
               {str(k): float(v) for k, v in (d.get("cost") or {}).items()})


@dataclasses.dataclass(frozen=True, kw_only=True)
class VetConfig:
  """How modules are vetted (see the module docstring for the checks).

  Budget defaults, from the legitimate modules of the repository (the offline proposer's
  templates, `tests/rewards` examples, the monolithic fusion of five templates) measured with
  this harness at `eval_batch=2048` on XLA:CPU (`tests/rewards/test_sandbox_cost.py` prints them):
  at most 16 elements of growth, 80 bytes and 63 flops per sample (a `jnp.stack` of 16 scalars;
  the templates: 8-36 bytes, 2-19 flops; a fused six-term module: 28 bytes, 35 flops). The
  budgets sit 64x (growth, against the 1,024-element floor) to 200x above that and far below the
  issue's doubling module (8.4M elements, 32 MB per sample).

  Attributes:
    batch: batch size of the test-run's sample features.
    seed: seed of the random sample features.
    eval_batch: batch the cost is measured at: 2,048 = one rollout of MLREF's brax config
      (`configs/mlref_brax.py`: 32 envs x 64 steps), the batch the issue's module crashed on. PPO
      (`rl_control.ppo`) calls the reward per step on `[seeds, num_envs]` (64 there), so
      per-sample costs at 2,048 bound the real ones and batch-quadratic intermediates show.
    max_growth: K, the largest intermediate may hold K x the largest per-sample feature size
      elements per sample (legitimate modules: ≤ 1x; `jnp.stack` of 16 scalars: 16 elements).
    growth_floor: lower bound on that limit in elements per sample (scalar-only tasks).
    max_bytes_per_sample: budget on (argument + output + temp bytes) / eval_batch of the module
      compiled for eval_batch.
    max_flops_per_sample: budget on (flops + transcendentals) / eval_batch.
    startup_s: wall / CPU allowance for the child to start and import JAX.
    per_module_s: wall / CPU allowance per module (growth trace, one compile, two test calls).
    memory_bytes: address-space limit of the child (JAX needs ≥ ~3 GiB).
    namespaces: passed to `run_sandboxed`.
    root: where the temporary directories go.
  """
  batch: int = 4
  seed: int = 0
  eval_batch: int = 2048
  max_growth: int = 64
  growth_floor: int = 1024
  max_bytes_per_sample: float = 16384.0
  max_flops_per_sample: float = 16384.0
  startup_s: float = 60.0
  per_module_s: float = 20.0
  memory_bytes: int = 4 << 30
  namespaces: Namespaces = "auto"
  root: str | None = None

  def __post_init__(self):
    for name in ("batch", "eval_batch", "max_growth", "growth_floor"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"VetConfig.{name} must be >= 1, got {getattr(self, name)!r}")
    for name in ("max_bytes_per_sample", "max_flops_per_sample"):
      if not float(getattr(self, name)) > 0:
        raise ValueError(f"VetConfig.{name} must be > 0, got {getattr(self, name)!r}")


# Part of every cache key: verdicts of an older set of checks (before the cost bound) are not
# reused. Budgets are not part of it: a cache is meant for one configuration.
VET_RULES = "growth+cost-v1"


def code_key(code: str, feature_spec: Mapping[str, Sequence[int]]) -> str:
  """Cache key of a vetting verdict: the checks' version, the code and the feature shapes."""
  spec = json.dumps({k: list(v) for k, v in sorted(feature_spec.items())})
  return hashlib.sha256((VET_RULES + "\0" + spec + "\0" + code).encode()).hexdigest()[:32]


def vet_modules(codes: Sequence[str], feature_spec: Mapping[str, Sequence[int]], *,
                config: VetConfig = VetConfig(),
                cache: MutableMapping[str, Verdict] | None = None) -> list[Verdict]:
  """Validates, bounds the cost per sample of, and test-runs module code; one verdict per code.

  The growth and cost checks (see the module docstring and `VetConfig`) run at
  `config.eval_batch` on abstract inputs before the test-run at `config.batch`, so a module that
  would exhaust the trainer's memory is rejected without ever being run big.

  All modules of a call share one sandboxed child (one JAX start-up); a module that kills or
  hangs the child is rejected with that reason and the remaining ones run in a fresh child.
  Identical code is vetted once; `cache` (keyed by `code_key`) carries verdicts across calls.

  Args:
    codes: module sources.
    feature_spec: feature name → per-sample shape, e.g. {"x_velocity": (), "action": (8,)}.
    config: `VetConfig`.
    cache: optional verdict cache, updated in place.

  Returns:
    `Verdict`s aligned with `codes`.
  """
  feature_spec = {k: tuple(int(d) for d in v) for k, v in feature_spec.items()}
  cache = {} if cache is None else cache
  keys = [code_key(c, feature_spec) for c in codes]
  pending: dict[str, dict] = {}
  for key, code in zip(keys, codes):
    if key in cache or key in pending:
      continue
    try:
      info = module_code.validate_module_code(code, feature_spec.keys())
    except module_code.ModuleCodeError as e:
      cache[key] = Verdict(False, str(e), "validate")
      continue
    pending[key] = {"key": key, "code": code, "function": info.function_name}
  todo = list(pending.values())
  while todo:
    done, todo = _run_harness(todo, feature_spec, config)
    cache.update(done)
  return [cache[k] for k in keys]


def _run_harness(todo: list[dict], feature_spec, config: VetConfig):
  """One child for `todo`; returns (verdicts, modules still to run in a fresh child)."""
  nonce = secrets.token_hex(8)
  budget = config.startup_s + config.per_module_s * len(todo)
  limits = SandboxLimits(cpu_s=budget, wall_s=budget, memory_bytes=config.memory_bytes)
  payload = {"nonce": nonce, "modules": todo, "features": feature_spec, "batch": config.batch,
             "seed": config.seed, "eval_batch": config.eval_batch,
             "max_growth": config.max_growth, "growth_floor": config.growth_floor,
             "max_bytes_per_sample": config.max_bytes_per_sample,
             "max_flops_per_sample": config.max_flops_per_sample}
  with open(_HARNESS) as f:
    harness = f.read()
  prefix = nonce + " "

  def watchdog(line):
    # Each module gets `per_module_s` from its "start" line: a hanging module costs its own
    # allowance, not the whole batch's.
    if line.startswith(prefix) and '"start"' in line:
      return config.per_module_s
    return None

  res = run_sandboxed(harness, stdin=json.dumps(payload), limits=limits,
                      namespaces=config.namespaces, root=config.root, arm_later=True,
                      watchdog=watchdog, initial_deadline_s=config.startup_s)
  verdicts, started = {}, None
  for line in res.stdout.splitlines():
    if not line.startswith(nonce + " "):
      continue
    try:
      msg = json.loads(line[len(nonce) + 1:])
    except json.JSONDecodeError:
      continue
    if msg.get("event") == "start":
      started = msg["key"]
    elif msg.get("event") == "result" and msg.get("key") in {m["key"] for m in todo}:
      # Finite numbers only: verdicts are saved in the JSON state (`allow_nan=False`).
      cost = {str(k): float(v) for k, v in (msg.get("cost") or {}).items()
              if isinstance(v, (int, float)) and math.isfinite(v)}
      verdicts[msg["key"]] = Verdict(bool(msg["ok"]), str(msg.get("reason", ""))[:500],
                                     "ok" if msg["ok"] else str(msg.get("stage") or "test-run"),
                                     cost)
      started = None
  rest = [m for m in todo if m["key"] not in verdicts]
  if not rest:
    return verdicts, []
  if started is None:
    # The child died before any module started (or between modules): nothing to blame a module
    # for, and retrying would loop. Reject the rest with the sandbox's reason.
    why = res.describe(limits)
    for m in rest:
      verdicts[m["key"]] = Verdict(False, f"sandbox failed: {why}", "test-run")
    return verdicts, []
  why = (f"time limit exceeded ({config.per_module_s:g} s per module)" if res.timed_out else
         res.describe(limits))
  verdicts[started] = Verdict(False, why, "test-run")
  return verdicts, [m for m in rest if m["key"] != started]
