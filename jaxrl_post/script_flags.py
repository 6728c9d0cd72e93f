"""absl flags for scripts that tests import in-process, next to other scripts.

absl's flags live in one process-wide registry in which a name may be defined by one module
only, and several scripts name theirs alike (`--config`, `--workdir`, `--out`): a test session
that imports two of them would stop with `DuplicateFlagError`. Such a script defines its flags
on a `FlagValues` of its own and starts through `run`, which adds them to absl's registry
(so `--help` lists them) only when the script is the program:

    FLAGS = flags.FlagValues()
    _OUT = flags.DEFINE_string("out", None, "...", flag_values=FLAGS)
    ...
    if __name__ == "__main__":
      script_flags.run(main, FLAGS)

A test calls `parse(FLAGS, ["prog", "--out=x", ...])` (or a `main` that does) instead.
"""

from __future__ import annotations

from typing import Callable, Sequence

from absl import app, flags


def parse(own: flags.FlagValues, argv: Sequence[str]) -> list[str]:
  """Sets `own` from `argv` (program name first), every flag not named to its default.

  Returns:
    the program name and the arguments that are not flags (those after `--` included, the
    `--` itself dropped), as `app.run` hands them to `main`.
  """
  own.unparse_flags()
  return own(list(argv))


def run(main: Callable[[list[str]], int | None], own: flags.FlagValues) -> None:
  """`app.run(main)` with the flags of `own` (parsed from `sys.argv`, `--help` included)."""
  flags.FLAGS.append_flag_values(own)  # The same flag objects: parsing sets `own`'s values.
  for module, defined in own.flags_by_module_dict().items():
    for flag in defined:  # `--help` lists the flags of the main module.
      flags.FLAGS.register_flag_by_module(module, flag)

  def parser(argv):
    rest = app.parse_flags_with_usage(argv)
    own.mark_as_parsed()
    return rest

  app.run(main, flags_parser=parser)
