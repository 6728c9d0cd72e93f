"""Child-side bootstrap of the sandbox: confine this process, then run the given program.

Run as `python -I -B _sandbox_boot.py BOX PROGRAM CONFIG_JSON STATUS_FD` by `sandbox.py`; it is a
plain script (standard library only, never imported by the package) so that nothing untrusted can
run before the limits are in place. Layers, in order:

1. Resource limits (`resource.setrlimit`, soft = hard so they cannot be raised again): CPU seconds,
   address space, file size, open files, no core dumps. Set here, in the child's first lines,
   rather than in a `preexec_fn`: `preexec_fn` is documented as unsafe in a threaded parent (the
   trainer runs XLA threads) and forces `fork` instead of `vfork`.
2. Namespaces (Linux; when the kernel allows unprivileged user namespaces or we are root):
   a new user + mount + network + PID namespace. The network namespace has only a loopback
   interface that is down: no route anywhere, enforced by the kernel. In the mount namespace every
   mount is remounted read-only except a bind mount of BOX, a fresh /proc shows only the sandbox's
   own processes, and a second user + mount namespace locks those mounts so the child cannot
   remount them writable. In the PID namespace the child cannot signal processes outside.
3. An audit hook (PEP 578) that refuses writes outside BOX, sockets, process creation, signals
   and (once armed) ctypes. Audit hooks alone are not a security boundary (ctypes can patch
   memory), which is why (1) and (2) exist; the hook is the fallback where namespaces are
   unavailable and gives readable error messages everywhere.

The status fd gets one JSON line with the isolation layers in force and, when the program ran in a
forked PID-namespace child, a second line with its exit status and CPU time. The program itself
never holds that fd.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
ARM_EVENT = "jaxrl_post.sandbox.arm"

_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DENIED_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.startfile", "webbrowser.open",
    "sys.remote_exec", "os.setuid", "os.setgid", "os.setreuid", "os.setregid"})
# Path-mutating events and the argument positions that hold paths.
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.mkdir": (0,),
    "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.link": (0, 1), "os.symlink": (0, 1), "os.setxattr": (0,), "os.removexattr": (0,),
    "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.copyfile": (1,), "shutil.copytree": (1,),
    "os.mkfifo": (0,), "os.mknod": (0,), "os.chflags": (0,), "os.lchflags": (0,),
}


def _libc():
  return ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path, text):
  with open(path, "w") as f:
    f.write(text)


def set_limits(cfg):
  def both(kind, value):
    value = int(value)
    resource.setrlimit(kind, (value, value))

  # soft == hard: the kernel SIGKILLs at the limit (a PID-namespace init ignores SIGXCPU).
  both(resource.RLIMIT_CPU, max(1, int(cfg["cpu_s"] + 0.999)))
  both(resource.RLIMIT_AS, cfg["memory_bytes"])
  both(resource.RLIMIT_FSIZE, cfg["file_bytes"])
  both(resource.RLIMIT_NOFILE, cfg["open_files"])
  both(resource.RLIMIT_CORE, 0)


def enter_namespaces(libc, box):
  """Stage A (user+mount+net+pid ns) in the caller; returns after forking the PID-ns init."""
  uid, gid = os.geteuid(), os.getegid()
  _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
  _write("/proc/self/setgroups", "deny")
  _write("/proc/self/uid_map", f"0 {uid} 1")
  _write("/proc/self/gid_map", f"0 {gid} 1")


def confine_mounts(libc, box):
  """In the PID-ns init: read-only everything but BOX, fresh /proc, then lock (stage B)."""
  _check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "make-private")
  bbox = box.encode()
  _check(libc.mount(bbox, bbox, None, ctypes.c_ulong(MS_BIND | MS_REC), None), "bind box")
  # A /proc of this PID namespace: the child sees (and can reach) only its own processes.
  _check(libc.mount(b"proc", b"/proc", b"proc",
                    ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None), "mount proc")
  failed = []
  with open("/proc/self/mountinfo") as f:
    lines = f.read().splitlines()
  for line in lines:
    parts = line.split()
    point = parts[4].encode().decode("unicode_escape")
    if point == box:
      continue
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for opt in parts[5].split(","):
      flags |= _MOUNT_FLAGS.get(opt, 0)  # Keep (locked) per-mount flags, else EPERM.
    if libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
      failed.append(point)
  if "/" in failed:
    raise OSError("could not remount / read-only")
  # Stage B: mounts copied into a less privileged mount namespace are locked read-only.
  _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare (lock)")
  return failed


def install_audit_hook(box, armed):
  """PEP 578 hook: writes only under BOX, no sockets / processes / signals; ctypes once armed."""
  state = {"armed": armed}
  realpath, isinstance_, str_, bytes_, int_ = os.path.realpath, isinstance, str, bytes, int
  fspath, permission_error = os.fspath, PermissionError
  prefix = box.rstrip("/") + "/"

  def inside(path):
    if isinstance_(path, int_):
      return True  # An already-open fd: nothing new is reached.
    try:
      p = fspath(path)
      if isinstance_(p, bytes_):
        p = p.decode("utf-8", "surrogateescape")
      p = realpath(p)
    except Exception:  # noqa: BLE001 - an unreadable path is refused.
      return False
    return p == box or p.startswith(prefix) or p == "/dev/null"

  def hook(event, args):
    if event == ARM_EVENT:
      state["armed"] = True
    elif event == "open":
      path, mode, flags = (tuple(args) + (None, None, None))[:3]
      writes = ((isinstance_(flags, int_) and flags & _WRITE_FLAGS) or
                (isinstance_(mode, str_) and any(c in mode for c in "wax+")))
      if writes and not inside(path):
        raise permission_error(f"sandbox: write outside the sandbox directory: {path!r}")
    elif event in _PATH_EVENTS:
      for i in _PATH_EVENTS[event]:
        if i < len(args) and not inside(args[i]):
          raise permission_error(f"sandbox: {event} outside the sandbox directory")
    elif event in _DENIED_EVENTS or event.startswith("socket.") or event.startswith("_posixsub"):
      raise permission_error(f"sandbox: {event} is not allowed")
    elif state["armed"] and (event.startswith("ctypes.") or event == "sys.addaudithook"
                             or event == "mmap.__new__"):
      raise permission_error(f"sandbox: {event} is not allowed")

  sys.addaudithook(hook)


def relay_child(pid, status_fd):
  """Waits for the PID-namespace init and exits the same way, reporting its CPU time."""
  while True:
    try:
      _, status, usage = os.wait4(pid, 0)
      break
    except InterruptedError:
      continue
  cpu = usage.ru_utime + usage.ru_stime
  sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
  code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
  os.write(status_fd, (json.dumps({"exit": code, "signal": sig, "cpu_s": cpu}) + "\n").encode())
  os.close(status_fd)
  if sig:
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
      signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
  os._exit(code if code is not None else 1)


def main():
  box, program, cfg_json, status_fd = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
  cfg = json.loads(cfg_json)
  box = os.path.realpath(box)
  set_limits(cfg)
  libc = _libc()
  layers = ["rlimits"]
  linux = sys.platform.startswith("linux")
  if linux:
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot gain privileges.
  forked = False
  if cfg["namespaces"] != "off" and linux:
    try:
      enter_namespaces(libc, box)
      forked = True
    except OSError as e:
      if cfg["namespaces"] == "require":
        os.write(status_fd, (json.dumps({"error": f"namespaces unavailable: {e}"}) + "\n").encode())
        os._exit(70)
  if cfg["namespaces"] == "require" and not forked:
    os.write(status_fd, (json.dumps({"error": "namespaces unavailable (not Linux)"}) +
                         "\n").encode())
    os._exit(70)
  if forked:
    pid = os.fork()  # The child is PID 1 of the new PID namespace.
    if pid:
      relay_child(pid, status_fd)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # Die with the relay (killpg on timeout).
    try:
      confine_mounts(libc, box)
      layers += ["netns", "pidns", "readonly_fs"]
    except OSError as e:
      os.write(status_fd, (json.dumps({"error": f"mount confinement failed: {e}"}) + "\n").encode())
      os._exit(70)
  os.chdir(box)  # After the bind mount, so that the cwd is the writable mount.
  if cfg.get("audit_hook", True):
    install_audit_hook(box, armed=not cfg.get("arm_later", False))
    layers.append("audit_hook")
  os.write(status_fd, (json.dumps({"layers": layers}) + "\n").encode())
  os.close(status_fd)  # The program never holds the status fd.
  del libc
  sys.argv = [program]
  with open(program) as f:
    source = f.read()
  glb = {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__}
  exec(compile(source, program, "exec"), glb)  # noqa: S102


if __name__ == "__main__":
  main()
