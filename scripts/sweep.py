r"""Expands a config file's `sweep(add, arg)` into runs: command lines, or a SLURM job array.

  python scripts/sweep.py --config=configs/grpo_arith.py:runlocal --workdir=/tmp/sweeps/arith \
      --dry-run                                   # print the command of every run
  python scripts/sweep.py --config=configs/grpo_arith.py --workdir=/tmp/sweeps/arith
                                                  # run them one after another here
  python scripts/sweep.py --config=configs/grpo_arith.py --workdir=/shared/sweeps/arith \
      --slurm --sbatch="--partition=gpu --gpus-per-node=8 --time=04:00:00"
                                                  # write <workdir>/sweep.sbatch and sbatch it

A config declares its sweep next to `get_config` (big_vision's convention):

  def sweep(add, arg=None):
    for lr in (1e-5, 3e-5):
      add(**{"optimizer.lr": lr})

Each `add(**overrides)` is one run:
  python experiments/<binary>.py --config=<file>:<arg> --workdir=<workdir>/<name> \
      --config.<key>=<value> ...
The binary is `experiments/<config file's name>.py` when there is one (`opd_family.py`), else
the name's prefix (`grpo_arith.py` → `experiments/grpo.py`), unless `--binary` names one.
A run's name numbers it and spells its overrides (`003_loss.name=gspo_optimizer.lr=2e-05`), so
workdirs say what they hold.
Extra arguments after `--` are appended to every command, e.g. `-- --config.steps=5` (absl
passes on every word that is not a flag, so the `--` is what keeps `--config.*` words for the
runs).
With `--slurm`, the file is a job array with one task per run; wrap each run
with `--launcher="bash scripts/launch_slurm.sh --per=gpu --"` to make it multi-process.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from absl import flags

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[1]

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_CONFIG = flags.DEFINE_string("config", None, "config file, optionally with :arg",
                              flag_values=FLAGS, required=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "base directory; one subdirectory a run",
                               flag_values=FLAGS, required=True)
_BINARY = flags.DEFINE_string("binary", None, "experiment script (default: by prefix)",
                              flag_values=FLAGS)
_PYTHON = flags.DEFINE_string("python", "python", "interpreter in the commands", flag_values=FLAGS)
_LAUNCHER = flags.DEFINE_string("launcher", "", "prefix of every command", flag_values=FLAGS)
_DRY_RUN = flags.DEFINE_bool("dry-run", False, "print, do not run or submit", flag_values=FLAGS)
_SLURM = flags.DEFINE_bool("slurm", False, "write a job array and sbatch it", flag_values=FLAGS)
_SLURM_FILE = flags.DEFINE_string("slurm_file", None, "default: <workdir>/sweep.sbatch",
                                  flag_values=FLAGS)
_SBATCH = flags.DEFINE_string("sbatch", "", "extra #SBATCH options, e.g. '--time=1:00:00'",
                              flag_values=FLAGS)


def load_config_module(path: str):
  """Imports a config file by path (the same way `config_flags` does)."""
  return load_module(path)


def expand(module, arg: str | None) -> list[dict]:
  """The overrides of every run, in declaration order: `sweep(add, arg)`'s `add` calls."""
  if not hasattr(module, "sweep"):
    raise ValueError(f"{module.__name__} defines no sweep(add, arg)")
  runs: list[dict] = []
  module.sweep(lambda **overrides: runs.append(dict(overrides)), arg)
  if not runs:
    raise ValueError(f"{module.__name__}.sweep added no runs")
  return runs


def format_value(value) -> str:
  """A value as `--config.key=` takes it: text as is, others by `repr` (lists as tuples)."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    value = tuple(value)
  return repr(value)


def run_name(index: int, overrides: dict) -> str:
  """`003_key=value_key=value`, kept to filename-safe characters."""
  parts = [f"{key}={format_value(value)}" for key, value in overrides.items()]
  slug = re.sub(r"[^A-Za-z0-9._=+-]+", "-", "_".join(parts)).strip("-")
  return f"{index:03d}_{slug}"[:200]


def binary_for(config_path: str) -> str:
  """The binary of a config: the module's `BINARY` when it names one (the RL-family configs run
  on experiments/grpo.py or experiments/rtpo.py), else `experiments/<stem>.py` when it exists
  (`configs/opd_family.py` → `experiments/opd_family.py`), else the prefix names the algorithm
  (`configs/grpo_arith.py` → `experiments/grpo.py`)."""
  binary = getattr(load_config_module(config_path), "BINARY", None)
  if binary:
    return binary
  stem = Path(config_path).stem
  if (ROOT / "experiments" / f"{stem}.py").exists():
    return f"experiments/{stem}.py"
  return f"experiments/{stem.split('_')[0]}.py"


def commands(config: str, workdir: str, *, binary: str | None = None, launcher: str = "",
             python: str = "python", extra: list[str] = ()) -> list[tuple[str, str]]:
  """`(name, command line)` for every run of `config` (`file.py` or `file.py:arg`)."""
  path, _, arg = config.partition(":")
  runs = expand(load_config_module(path), arg or None)
  binary = binary or binary_for(path)
  out = []
  for i, overrides in enumerate(runs):
    name = run_name(i, overrides)
    words = [python, binary, f"--config={config}", f"--workdir={workdir.rstrip('/')}/{name}"]
    words += [f"--config.{key}={format_value(value)}" for key, value in overrides.items()]
    words += list(extra)
    line = shlex.join(words)
    out.append((name, f"{launcher} {line}" if launcher else line))
  return out


def slurm_script(runs: list[tuple[str, str]], workdir: str, *, job_name: str,
                 sbatch_args: str = "", chdir: str = str(ROOT)) -> str:
  """A job-array batch script: task i runs command i, its log in `<workdir>/slurm/`."""
  lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}",
           f"#SBATCH --array=0-{len(runs) - 1}",
           f"#SBATCH --output={workdir.rstrip('/')}/slurm/%x_%A_%a.out"]
  lines += [f"#SBATCH {word}" for word in shlex.split(sbatch_args)]
  lines += ["set -euo pipefail", f"cd {shlex.quote(chdir)}", "COMMANDS=("]
  lines += [f"  {shlex.quote(command)}  # {name}" for name, command in runs]
  lines += [")", 'echo "run ${SLURM_ARRAY_TASK_ID}: ${COMMANDS[$SLURM_ARRAY_TASK_ID]}"',
            'eval "${COMMANDS[$SLURM_ARRAY_TASK_ID]}"', ""]
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  """Runs, prints or submits the sweep; `argv`: the program name, then the words after `--`."""
  extra = list(argv[1:])
  runs = commands(_CONFIG.value, _WORKDIR.value, binary=_BINARY.value, launcher=_LAUNCHER.value,
                  python=_PYTHON.value, extra=extra)
  if _SLURM.value:
    job_name = Path(_CONFIG.value.partition(":")[0]).stem
    script = slurm_script(runs, _WORKDIR.value, job_name=job_name, sbatch_args=_SBATCH.value)
    path = Path(_SLURM_FILE.value or Path(_WORKDIR.value) / "sweep.sbatch")
    path.parent.mkdir(parents=True, exist_ok=True)
    # SLURM does not create the directory of --output; a missing one loses the logs.
    (Path(_WORKDIR.value) / "slurm").mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    if _DRY_RUN.value:
      print(f"# {path} ({len(runs)} array tasks; submit with: sbatch {path})")
      print(script, end="")
      return 0
    return subprocess.run(["sbatch", str(path)], check=False).returncode
  for name, command in runs:
    print(command, flush=True)
    if not _DRY_RUN.value:
      code = subprocess.run(command, shell=True, cwd=ROOT, check=False).returncode
      if code:
        print(f"run {name} failed with exit code {code}", file=sys.stderr)
        return code
  return 0


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
