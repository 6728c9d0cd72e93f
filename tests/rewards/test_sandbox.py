"""The sandbox: hostile programs and modules are rejected or neutralised; nothing leaks out.

Raw programs (not module code) exercise the process-level layers directly: they bypass the AST
allow-list on purpose, as a worst case of a validator bug.
"""

import socket
import textwrap
import time

import pytest

from jaxrl_post.rewards import sandbox as sb

FAST = sb.SandboxLimits(cpu_s=5, wall_s=20, memory_bytes=1 << 30)
FEATURES = {"v": (), "a": (3,)}


def _kernel_layers(root):
  layers = sb.isolation_layers(root=root)
  return {"netns", "readonly_fs", "pidns"} <= set(layers)


@pytest.fixture
def outside(tmp_path):
  """A directory outside the sandbox that hostile code tries to write into."""
  d = tmp_path / "outside"
  d.mkdir()
  (d / "keep.txt").write_text("original")
  yield d
  assert sorted(p.name for p in d.iterdir()) == ["keep.txt"]
  assert (d / "keep.txt").read_text() == "original"


@pytest.fixture
def listener():
  """A TCP listener on 127.0.0.1 that counts connections (none may arrive from the sandbox)."""
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  s.listen(8)
  s.setblocking(False)
  yield s.getsockname()[1]

  def count():
    n = 0
    while True:
      try:
        conn, _ = s.accept()
      except BlockingIOError:
        return n
      conn.close()
      n += 1

  assert count() == 0
  s.close()


def _run(program, root, **kw):
  return sb.run_sandboxed(textwrap.dedent(program), limits=kw.pop("limits", FAST), root=root,
                          **kw)


def test_benign_program_writes_only_in_its_directory(sandbox_root):
  res = _run("""
      import os
      open("out.txt", "w").write("hi")
      print(sorted(os.listdir(".")), os.environ.get("HOME") == os.getcwd())
      """, sandbox_root)
  assert res.ok, res.stderr
  assert res.stdout.strip() == "['out.txt', 'program.py'] True"
  assert "rlimits" in res.layers and "audit_hook" in res.layers


@pytest.mark.parametrize("namespaces", ["auto", "off"])
def test_hostile_file_writes_blocked(sandbox_root, outside, namespaces):
  target = str(outside / "pwned")
  res = _run(f"""
      import os, shutil
      results = []
      for attempt in [lambda: open({target!r}, "w"),
                      lambda: os.open({target!r}, os.O_WRONLY | os.O_CREAT),
                      lambda: open({str(outside / 'keep.txt')!r}, "a"),
                      lambda: os.remove({str(outside / 'keep.txt')!r}),
                      lambda: os.rename({str(outside / 'keep.txt')!r}, {target!r}),
                      lambda: os.symlink("/etc/passwd", {target!r}),
                      lambda: shutil.rmtree({str(outside)!r}),
                      lambda: os.mkdir({target!r})]:
        try:
          attempt()
          results.append("WROTE")
        except OSError as e:
          results.append(type(e).__name__)
      print(results)
      """, sandbox_root, namespaces=namespaces)
  assert res.ok, res.stderr
  assert "WROTE" not in res.stdout


def test_hostile_network_blocked(sandbox_root, listener):
  res = _run(f"""
      import socket
      for make in [lambda: socket.create_connection(("127.0.0.1", {listener}), timeout=2),
                   lambda: socket.socket().connect(("127.0.0.1", {listener}))]:
        try:
          make()
          print("CONNECTED")
        except OSError as e:
          print("blocked", e)
      """, sandbox_root)
  assert res.ok, res.stderr
  assert "CONNECTED" not in res.stdout and res.stdout.count("blocked") == 2


def test_hostile_processes_and_import_tricks_blocked(sandbox_root, outside):
  res = _run(f"""
      import os
      attempts = {{
        "system": lambda: os.system("touch {outside}/pwned"),
        "subprocess": lambda: __import__("subprocess").run(["touch", "{outside}/pwned"]),
        "fork": lambda: os.fork(),
        "kill": lambda: os.kill(1, 9),
        "ctypes": lambda: __import__("ctypes").CDLL(None),
        "exec": lambda: os.execv("/bin/sh", ["sh"]),
      }}
      for name, attempt in attempts.items():
        try:
          attempt()
          print(name, "ALLOWED")
        except (OSError, RuntimeError) as e:
          print(name, "blocked")
      """, sandbox_root)
  assert res.ok, res.stderr
  assert "ALLOWED" not in res.stdout and res.stdout.count("blocked") == 6


def test_environment_is_scrubbed(sandbox_root, monkeypatch):
  monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-do-not-leak")
  res = _run("import os; print(sorted(os.environ))", sandbox_root)
  assert res.ok
  assert "OPENAI_API_KEY" not in res.stdout and "sk-secret" not in res.stdout


def test_infinite_loop_hits_cpu_limit(sandbox_root):
  t = time.monotonic()
  res = _run("while True: pass", sandbox_root,
             limits=sb.SandboxLimits(cpu_s=1, wall_s=20, memory_bytes=1 << 30))
  assert not res.ok and time.monotonic() - t < 15
  assert res.returncode < 0
  assert "CPU" in res.describe(sb.SandboxLimits(cpu_s=1))


def test_sleeping_program_hits_wall_clock(sandbox_root):
  res = _run("import time; time.sleep(60)", sandbox_root,
             limits=sb.SandboxLimits(cpu_s=5, wall_s=1, memory_bytes=1 << 30))
  assert res.timed_out and not res.ok
  assert "wall-clock" in res.describe()


def test_huge_allocation_hits_memory_limit(sandbox_root):
  res = _run("x = bytearray(8 << 30)", sandbox_root)
  assert not res.ok and "MemoryError" in res.stderr


def test_output_flood_is_capped(sandbox_root):
  res = _run("import sys\nfor _ in range(4000): sys.stdout.write('x' * 1024)", sandbox_root,
             limits=sb.SandboxLimits(cpu_s=5, wall_s=20, memory_bytes=1 << 30,
                                     output_bytes=10_000))
  assert res.ok and len(res.stdout) == 10_000


def test_kernel_layers_hold_without_audit_hook(sandbox_root, outside, listener):
  if not _kernel_layers(sandbox_root):
    pytest.skip("kernel namespaces unavailable here; the audit hook is the only layer")
  res = _run(f"""
      import ctypes, errno, os, socket
      try:
        open({str(outside / 'pwned')!r}, "w")
        print("WROTE")
      except OSError as e:
        print("fs", errno.errorcode[e.errno])
      try:
        socket.create_connection(("127.0.0.1", {listener}), timeout=2)
        print("CONNECTED")
      except OSError as e:
        print("net", errno.errorcode[e.errno])
      libc = ctypes.CDLL(None, use_errno=True)
      print("remount", libc.mount(None, b"/", None, ctypes.c_ulong(32 | 4096), None))
      print("pid", os.getpid(), "visible", sorted(int(p) for p in os.listdir("/proc")
                                                  if p.isdigit()))
      """, sandbox_root, audit_hook=False, namespaces="require")
  assert res.ok, res.stderr
  assert "fs EROFS" in res.stdout
  assert "net ENETUNREACH" in res.stdout
  assert "remount -1" in res.stdout
  assert "pid 1 visible [1]" in res.stdout


# ---------------------------------------------------------------------------------------------
# Vetting modules.
# ---------------------------------------------------------------------------------------------

GOOD = 'def fwd(f):\n  return jnp.tanh(f["v"]) - 0.1 * jnp.sum(jnp.square(f["a"]), axis=-1)\n'
HOSTILE_MODULES = {
    "nan": 'def m(f):\n  return jnp.log(f["v"])\n',  # NaN on negative inputs
    "inf": 'def m(f):\n  return jnp.ones_like(f["v"]) * 1e39\n',  # float32 overflow
    "div_zero": 'def m(f):\n  return 1.0 / f["v"]\n',  # inf on the all-zero features
    "wrong_shape": 'def m(f):\n  return f["a"]\n',
    "scalar_python": 'def m(f):\n  return 1.0\n',
    "int_output": 'def m(f):\n  return jnp.sign(f["v"]) > 0\n',
    "shape_error": 'def m(f):\n  return jnp.cross(f["a"], f["v"])\n',
    "int_bomb": 'def m(f):\n  return 9 ** 9 ** 9 + f["v"]\n',  # hangs Python: per-module timeout
    "import": 'import os\ndef m(f):\n  return f["v"]\n',
    "dunder_import": 'def m(f):\n  return __import__("os").getpid() + f["v"]\n',
    "open": 'def m(f):\n  return open("/etc/passwd") + f["v"]\n',
    "subclasses": 'def m(f):\n  return ().__class__.__bases__[0].__subclasses__()\n',
}


def test_vet_modules_rejects_hostile_and_keeps_good(sandbox_root, monkeypatch):
  calls = []
  real = sb.run_sandboxed
  monkeypatch.setattr(sb, "run_sandboxed", lambda *a, **k: calls.append(1) or real(*a, **k))
  names = sorted(HOSTILE_MODULES)
  codes = [GOOD] + [HOSTILE_MODULES[n] for n in names] + [GOOD]
  cache = {}
  cfg = sb.VetConfig(per_module_s=4, startup_s=60, root=sandbox_root)
  verdicts = sb.vet_modules(codes, FEATURES, config=cfg, cache=cache)
  assert verdicts[0].ok and verdicts[-1].ok, verdicts[0]
  by_name = dict(zip(names, verdicts[1:-1]))
  for name, v in by_name.items():
    assert not v.ok and v.reason, name
  for name in ["import", "dunder_import", "open", "subclasses"]:
    assert by_name[name].stage == "validate", name
  assert "non-finite" in by_name["nan"].reason and "non-finite" in by_name["inf"].reason
  assert "zero" in by_name["div_zero"].reason
  assert "shape" in by_name["wrong_shape"].reason
  assert "time limit" in by_name["int_bomb"].reason
  # One child for the batch, one more after the hanging module; identical code vetted once.
  assert len(calls) == 2
  again = sb.vet_modules([GOOD, HOSTILE_MODULES["nan"]], FEATURES, config=cfg, cache=cache)
  assert [v.ok for v in again] == [True, False] and len(calls) == 2
