"""Parsing of the compact config argument (`--config=file.py:ARG`), shared by configs/*.py.

`parse_arg("runlocal,model=small", runlocal=False, model="small")` turns the
string after the colon of `--config=configs/grpo_arith.py:runlocal,model=small`
into typed values: the defaults give the types, a bare `runlocal` means True,
and an unknown key is an error naming the valid keys.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import ml_collections


def _convert(key: str, text: str, default):
  if isinstance(default, bool):
    if text.lower() in ("1", "true", "yes", ""):
      return True
    if text.lower() in ("0", "false", "no"):
      return False
    raise ValueError(f"config arg {key}={text!r} is not a boolean")
  if default is None:
    return text
  try:
    return type(default)(text)
  except ValueError:
    raise ValueError(f"config arg {key}={text!r} is not a {type(default).__name__}") from None


def parse_arg(arg: str | None, **spec) -> ml_collections.ConfigDict:
  """Parses `key=value,flag,...` against `spec` (name → default value)."""
  values = dict(spec)
  for item in filter(None, (arg or "").split(",")):
    key, _, text = item.partition("=")
    key = key.strip()
    if key not in spec:
      raise ValueError(f"unknown config arg {key!r}; valid: {', '.join(sorted(spec))}")
    values[key] = _convert(key, text.strip(), spec[key])
  return ml_collections.ConfigDict(values)


def load_module(path: str | os.PathLike, name: str | None = None):
  """Imports a Python file by path (a config or script, which are not packages).

  How configs build on a sibling (`load_module(Path(__file__).with_name("rtpo_common.py"))`)
  and scripts read a config's `get_config` / `sweep` — the way `config_flags` loads them.

  Raises:
    FileNotFoundError: naming the path.
  """
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found")
  spec = importlib.util.spec_from_file_location(name or path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
