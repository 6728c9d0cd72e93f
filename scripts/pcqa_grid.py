r"""Runs the PCQA grid of configs/pcqa_synthetic.py in order, one process per run, then its table.

  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py --workdir=/tmp/pcqa
  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py:runlocal --workdir=/tmp/pcqa_smoke
  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py:capable=1000,rl_lr=3e-5 \
      --workdir=/tmp/pcqa_cap -- --config.eval_every=100     # extra flags for every run
  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py --workdir=/tmp/pcqa --dry-run

The config's `sweep(add, arg)` lists the runs in order, each a `seed`, a `method` and the
`start` it continues (base, capable or cold_start of the same seed). Run i is

  python experiments/pcqa.py --config=<file>:<arg>,method=<method> \
      --workdir=<workdir>/seed_<seed>/<method> --config.seed=<seed> \
      [--config.init_from=<workdir>/seed_<seed>/<start>] [extra flags]

and starts after the run it starts from has finished. Why not scripts/sweep.py: its runs are
independent (numbered workdirs, one config argument for all), while here a run's `init_from`
is another run's workdir and its `method` picks its length and optimizer in `get_config`.
A run whose `final.json` exists is skipped; an unfinished one resumes from its checkpoint. At
the end the table of every method over seeds (scripts/pcqa_table.py's `aggregate_runs`) goes
to `<workdir>/summary.json` and stdout.
"""

from __future__ import annotations

import json
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
_WORKDIR = flags.DEFINE_string("workdir", None, "root of the runs' workdirs", flag_values=FLAGS,
                               required=True)
_DRY_RUN = flags.DEFINE_bool("dry-run", False, "print the commands only", flag_values=FLAGS)


def _load(path: Path, name: str):
  return load_module(path, name)


def grid_runs(config: str, workdir: str, *, python: str = sys.executable,
              extra: list[str] = ()) -> list[tuple[Path, list[str]]]:
  """`(run workdir, command)` of every run of `config` (`file.py` or `file.py:arg`), in order."""
  path, _, arg = config.partition(":")
  entries: list[dict] = []
  _load(Path(path), Path(path).stem).sweep(lambda **kw: entries.append(kw), arg or None)
  root, out = Path(workdir), []
  for entry in entries:
    seed, method = entry["seed"], entry["method"]
    run = root / f"seed_{seed}" / method
    run_arg = ",".join(filter(None, [arg, f"method={method}"]))
    command = [python, str(ROOT / "experiments" / "pcqa.py"),
               f"--config={Path(path).resolve()}:{run_arg}",
               f"--workdir={run}", f"--config.seed={seed}"]
    if entry.get("start"):
      command.append(f"--config.init_from={root / f'seed_{seed}' / entry['start']}")
    out.append((run, command + list(extra)))
  return out


def main(argv: list[str]) -> int:
  """Runs the grid, then its table; `argv`: the program name, then the words after `--`."""
  workdir = _WORKDIR.value
  runs = grid_runs(_CONFIG.value, workdir, extra=list(argv[1:]))
  for run, command in runs:
    if _DRY_RUN.value:
      print(shlex.join(command))
      continue
    if (run / "final.json").exists():
      print(f"{run}: done, skipped", flush=True)
      continue
    print(f"{run}: {shlex.join(command)}", flush=True)
    subprocess.run(command, check=True)
  if _DRY_RUN.value:
    return 0
  config = json.loads(next(Path(workdir).glob("seed_*/base/config.json")).read_text())
  datasets, source = config["datasets"].split(","), config["source"]
  tables = _load(ROOT / "scripts" / "pcqa_table.py", "pcqa_table")
  rows = [m for m in tables.METHODS if any(r.name == m for r, _ in runs)]
  table = tables.aggregate_runs(workdir, rows, datasets, source=source)
  (Path(workdir) / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
  print(tables.format_table(table, datasets, source=source))
  return 0


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
