"""A run's policy as a Hugging Face model directory (`transformers.from_pretrained` loads it).

    export_run("/tmp/grpo_gsm8k", "/tmp/grpo_gsm8k_hf", dtype="bfloat16", max_shard_size="5GB")

The directory holds what a Hub repository of the model would:

  config.json, model.safetensors            `models.hf.save_hf`; sharded with
    (or model-0000i-of-0000n.safetensors     model.safetensors.index.json above
     + model.safetensors.index.json)         `max_shard_size`
  tokenizer.json, tokenizer_config.json,    copied from the directory the run's tokenizer was
    chat_template.jinja, ...                 read from (`TOKENIZER_FILES`, those present)
  generation_config.json                     the source checkpoint's sampling defaults, with
                                             the tokenizer's end-of-turn / pad ids

A run on a character tokenizer (`config.tokenizer="char"`) has no Hugging Face tokenizer
files: the model is exported alone, with a warning (`ExportReport.tokenizer_exported` False).
Parameters are read as `training.run_dir.load_run` reads them — into one device's memory by
default, whatever mesh the run trained on — and written one tensor at a time.

A LoRA run (`config.lora.rank` > 0, whose checkpoints hold adapters only) exports *merged*
weights (`run_dir.load_run`): its base is rebuilt as the run built it, the checkpoint's
adapters are attached, and every targeted kernel becomes K + s·a·b (`models.lora.merge_lora`),
so the directory is a plain model of the base architecture.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxrl_post.models import CausalLM
from jaxrl_post.models.hf import save_hf
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.run_dir import load_run

log = logging.getLogger(__name__)

# Tokenizer files of a Hugging Face repository, copied when the source has them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "added_tokens.json", "vocab.json", "merges.txt",
                   "vocab.txt", "tokenizer.model")
GENERATION_CONFIG_FILE = "generation_config.json"
# What `parse_size` accepts after the number; decimal units as `transformers` and the Hub use.
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class ExportReport(NamedTuple):
  """What `export_run` / `export_model` wrote."""

  path: Path
  step: int | None  # the run's checkpoint step (None for `export_model`)
  files: list[str]  # the file names in `path`, sorted
  tokenizer_exported: bool  # False: no Hugging Face tokenizer files (e.g. the char tokenizer)


def parse_size(size: str | int) -> int:
  """Bytes of `"5GB"`, `"500MB"`, `"1.5GiB"`, `"123"` or an int (GB = 10^9, GiB = 2^30).

  Raises:
    ValueError: an unparseable size or one ≤ 0, listing the units.
  """
  if isinstance(size, int):
    value = size
  else:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(size))
    unit = match.group(2).upper() if match else None
    if unit not in _SIZE_UNITS:
      raise ValueError(f"max_shard_size={size!r}: expected a number with one of the units "
                       f"{', '.join(u for u in _SIZE_UNITS if u)} (e.g. '5GB')")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
  if value <= 0:
    raise ValueError(f"max_shard_size={size!r} must be positive")
  return value


def export_dtype(name: str | None, model: CausalLM):
  """The numpy dtype named `name` (one of `setup.DTYPES`), default the model's parameter dtype.

  Raises:
    ValueError: an unknown name, listing the valid ones.
  """
  if name is None or name == "":
    return np.dtype(model.config.param_dtype)
  if name not in run_setup.DTYPES:
    raise ValueError(f"dtype={name!r} is not a dtype name; valid: "
                     f"{', '.join(run_setup.DTYPES)}")
  return np.dtype(run_setup.DTYPES[name])


def generation_config(tokenizer, source: dict[str, Any] | None = None) -> dict[str, Any]:
  """`generation_config.json`: `source`'s settings (sampling defaults), with the tokenizer's ids.

  `eos_token_id` is the tokenizer's end ids (`end_ids`: its eos, then the end-of-turn ids of
  the checkpoint it came from), so `generate` stops where our sampler stops; `pad_token_id` and
  `bos_token_id` are the tokenizer's too.
  """
  out = dict(source or {})
  end_ids = [int(i) for i in tokenizer.end_ids]
  out["eos_token_id"] = end_ids[0] if len(end_ids) == 1 else end_ids
  out["pad_token_id"] = int(tokenizer.pad_id)
  if tokenizer.bos_id is not None:
    out["bos_token_id"] = int(tokenizer.bos_id)
  return out


def _prepare(out: Path, overwrite: bool) -> None:
  if out.exists() and any(out.iterdir()):
    if not overwrite:
      raise FileExistsError(f"{out} is not empty; choose a new directory or pass overwrite "
                            "(--overwrite) to replace the model files in it")
    for item in out.iterdir():  # Stale shards of an earlier export would join the new index.
      if item.is_file() and (item.name.endswith((".safetensors", ".safetensors.index.json"))
                             or item.name in (*TOKENIZER_FILES, GENERATION_CONFIG_FILE,
                                              "config.json")):
        item.unlink()
  out.mkdir(parents=True, exist_ok=True)


def export_model(model: CausalLM, tokenizer, out: str | os.PathLike, *, dtype: str | None = None,
                 max_shard_size: str | int | None = "5GB", tokenizer_dir: str | None = None,
                 source_dir: str | os.PathLike | None = None,
                 overwrite: bool = False) -> ExportReport:
  """Writes `model` and `tokenizer` as a Hugging Face directory `out` (see the module docstring).

  Args:
    model, tokenizer: the policy.
    out: the output directory (created; an existing one must be empty unless `overwrite`).
    dtype: of the saved tensors, a `setup.DTYPES` name (default: the parameter dtype); it is
      also `config.json`'s `torch_dtype`.
    max_shard_size: shard the safetensors above this size (`parse_size`); None: one file.
    tokenizer_dir: where the tokenizer's files are (default: `tokenizer.source_dir`).
    source_dir: the checkpoint the policy started from, whose `generation_config.json` (if
      any) gives the sampling defaults; else `tokenizer_dir`'s.
    overwrite: replace the model, tokenizer and generation files of a non-empty `out`.

  Raises:
    ValueError: unknown dtype, bad size. FileExistsError: `out` not empty.
  """
  out = Path(out)
  np_dtype = export_dtype(dtype, model)
  max_shard_bytes = None if max_shard_size is None else parse_size(max_shard_size)
  _prepare(out, overwrite)
  save_hf(model, out, dtype=np_dtype, max_shard_bytes=max_shard_bytes)
  tokenizer_dir = tokenizer_dir or getattr(tokenizer, "source_dir", None)
  exported = False
  if tokenizer_dir and (Path(tokenizer_dir) / "tokenizer.json").is_file():
    for name in TOKENIZER_FILES:
      if (Path(tokenizer_dir) / name).is_file():
        shutil.copyfile(Path(tokenizer_dir) / name, out / name)
    exported = True
  else:
    log.warning("the tokenizer (%s) has no Hugging Face files (tokenizer.json); %s holds the "
                "model only: pair it with a tokenizer of the same ids before loading it with "
                "transformers' AutoTokenizer", type(tokenizer).__name__, out)
  source = None
  for directory in (source_dir, tokenizer_dir):
    if directory and (Path(directory) / GENERATION_CONFIG_FILE).is_file():
      source = json.loads((Path(directory) / GENERATION_CONFIG_FILE).read_text())
      break
  (out / GENERATION_CONFIG_FILE).write_text(
    json.dumps(generation_config(tokenizer, source), indent=2) + "\n")
  return ExportReport(out, None, sorted(p.name for p in out.iterdir()), exported)


def export_run(workdir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None,
               dtype: str | None = None, max_shard_size: str | int | None = "5GB",
               overwrite: bool = False, mesh=None, adapter: str | None = None) -> ExportReport:
  """The run in `workdir` at checkpoint `step` (default: the latest) as a Hugging Face directory.

  `dtype` defaults to the run's `config.param_dtype`. The generation defaults come from the
  checkpoint the run was initialised from (`config.init_from`), when that was a Hugging Face
  one. With a `mesh` the parameters are read sharded (`load_run`) and gathered tensor by tensor
  as they are written. A multi-LoRA run exports one tenant's adapters merged: `adapter`.

  Raises:
    FileNotFoundError: no config.json or no checkpoint in `workdir`.
    ValueError: `step` has no checkpoint (listing those there are), unknown dtype, bad size.
    FileExistsError: `out` not empty (without `overwrite`).
  """
  if dtype:  # Checked before the parameters are read.
    if dtype not in run_setup.DTYPES:
      raise ValueError(f"dtype={dtype!r} is not a dtype name; valid: "
                       f"{', '.join(run_setup.DTYPES)}")
  if max_shard_size is not None:
    parse_size(max_shard_size)
  run = load_run(workdir, step=step, mesh=mesh, adapter=adapter)
  first = run_setup.start_point(run.config, str(workdir), ignore_workdir=True)
  source_dir = first.path if first.kind == "init_from_hf" else None
  report = export_model(run.model, run.tokenizer, out, dtype=dtype, max_shard_size=max_shard_size,
                        source_dir=source_dir, overwrite=overwrite)
  log.info("exported %s step %d to %s", workdir, run.step, out)
  return report._replace(step=run.step)


