"""Model directories from the Hugging Face Hub: `"hf:<org>/<name>[@<revision>]"` → a local path.

A config names a checkpoint either by a local directory or by a Hub repository:

  resolve_model_dir("hf:Qwen/Qwen3-0.6B")          # ~/.cache/huggingface/hub/.../snapshots/<sha>
  resolve_model_dir("hf:Qwen/Qwen3-0.6B@<sha>")    # a pinned commit, branch or tag
  resolve_model_dir("/data/qwen3")                 # a local directory, returned as is

Only the files this codebase reads are fetched (`MODEL_FILE_PATTERNS`: configs, tokenizer files,
chat templates, safetensors and their index), into `huggingface_hub`'s cache (`cache_dir`, else
`HF_HUB_CACHE`, else `HF_HOME/hub`).

The cache is consulted first, and the network only when the cache lacks the files. A run that
downloaded its checkpoint once therefore never needs the Hub again: a restart on a machine
without network, or after the repository's branch moved on, loads the same snapshot it started
from (the policy a resumed run copies into its frozen references must not change). To pick up a
new upload, name the commit (`@<sha>`) or refresh the cache (`hf download <repo>`).
`HF_HUB_OFFLINE=1` forbids the network altogether; it is read when `resolve_model_dir` runs, not
only when `huggingface_hub` is imported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from jaxrl_post import tokenizers

HUB_PREFIX = "hf:"
CONFIG_FILE = "config.json"
# Files of the Hugging Face tokenizer formats this codebase can be given. `tokenizer.json` is the
# one `HFTokenizer` needs; the rest are optional (special tokens, chat template, end-of-turn ids)
# or belong to slow tokenizers and are fetched so that an exported directory stays complete.
REQUIRED_TOKENIZER_FILES = (tokenizers.TOKENIZER_FILE,)
OPTIONAL_TOKENIZER_FILES = (
  tokenizers.TOKENIZER_CONFIG_FILE,
  tokenizers.SPECIAL_TOKENS_MAP_FILE,
  tokenizers.CHAT_TEMPLATE_FILE,
  tokenizers.GENERATION_CONFIG_FILE,
  "added_tokens.json",
  "vocab.json",
  "merges.txt",
  "tokenizer.model",
)
TOKENIZER_FILE_PATTERNS = (
  CONFIG_FILE, *REQUIRED_TOKENIZER_FILES, *OPTIONAL_TOKENIZER_FILES, "*.jinja")
WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
MODEL_FILE_PATTERNS = TOKENIZER_FILE_PATTERNS + WEIGHT_FILE_PATTERNS

_TRUE = ("1", "ON", "YES", "TRUE")


class TokenizerFiles(NamedTuple):
  """Which tokenizer files a directory holds.

  Attributes:
    present: the known tokenizer files (required and optional) that exist.
    missing: the required ones that do not; empty when `HFTokenizer.from_dir` can load it.
  """

  present: tuple[str, ...]
  missing: tuple[str, ...]


def is_hub_spec(name_or_path: str | os.PathLike[str]) -> bool:
  """Whether `name_or_path` names a Hub repository (`"hf:..."`) rather than a local path."""
  return isinstance(name_or_path, str) and name_or_path.startswith(HUB_PREFIX)


def parse_hub_spec(spec: str) -> tuple[str, str | None]:
  """`"hf:<org>/<name>[@<revision>]"` → `(repo_id, revision or None)`.

  Repository ids cannot contain "@", so the last "@" starts the revision (a branch, tag or
  commit hash).

  Raises:
    ValueError: naming the spec and the expected form when it is malformed.
  """
  from huggingface_hub.errors import HFValidationError
  from huggingface_hub.utils import validate_repo_id

  expected = "expected 'hf:<org>/<name>' or 'hf:<org>/<name>@<revision>', e.g. 'hf:Qwen/Qwen3-0.6B'"
  if not is_hub_spec(spec):
    raise ValueError(f"{spec!r} is not a Hub repository spec: {expected}")
  repo_id, at, revision = spec[len(HUB_PREFIX):].partition("@")
  if at and not revision:
    raise ValueError(f"{spec!r} has an empty revision after '@': {expected}")
  if "/" not in repo_id:
    raise ValueError(f"{spec!r} has no organisation: {expected}")
  try:
    validate_repo_id(repo_id)
  except HFValidationError as e:
    raise ValueError(f"{spec!r} is not a valid repository id ({e}): {expected}") from None
  return repo_id, revision or None


def tokenizer_files(path: str | os.PathLike[str]) -> TokenizerFiles:
  """The tokenizer files present in directory `path` and the required ones missing."""
  path = Path(path)
  names = REQUIRED_TOKENIZER_FILES + OPTIONAL_TOKENIZER_FILES
  present = tuple(n for n in names if (path / n).is_file())
  missing = tuple(n for n in REQUIRED_TOKENIZER_FILES if not (path / n).is_file())
  return TokenizerFiles(present, missing)


def require_tokenizer_files(path: str | os.PathLike[str], *, source: str = "") -> Path:
  """`path` when it holds what `HFTokenizer.from_dir` needs.

  Args:
    path: the directory.
    source: what the directory was named by in the config (e.g. `"config.init_from='hf:...'"`),
      for the error message.

  Raises:
    FileNotFoundError: naming the directory, the missing and the present tokenizer files.
  """
  files = tokenizer_files(path)
  if files.missing:
    where = f"{source} → {path}" if source else str(path)
    raise FileNotFoundError(
      f"{where} is missing the tokenizer file(s) {', '.join(files.missing)}: expected "
      f"{', '.join(REQUIRED_TOKENIZER_FILES)} (and optionally "
      f"{', '.join(OPTIONAL_TOKENIZER_FILES)}); present: {', '.join(files.present) or 'none'}")
  return Path(path)


def resolve_model_dir(name_or_path: str | os.PathLike[str], *,
                      cache_dir: str | os.PathLike[str] | None = None,
                      weights: bool = True) -> Path:
  """The local directory of a checkpoint named by a Hub spec or a path.

  Args:
    name_or_path: `"hf:<org>/<name>[@<revision>]"`, or a local directory.
    cache_dir: the Hub cache to read and fill (default: `HF_HUB_CACHE` as set now, else
      `huggingface_hub`'s default, `HF_HOME/hub`).
    weights: also fetch and require the weights (`config.json` + `*.safetensors`); False fetches
      only configs and tokenizer files (a tokenizer without its model).

  Returns:
    The directory: the cache's snapshot directory for a Hub spec, the path itself otherwise.

  Raises:
    ValueError: a malformed Hub spec.
    FileNotFoundError: naming the repository or path: an unknown or gated repository or
      revision, a repository not cached while offline, the Hub unreachable, or a directory
      without `config.json` / safetensors (with `weights=True`).
  """
  if not is_hub_spec(name_or_path):
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
      raise FileNotFoundError(
        f"{os.fspath(name_or_path)!r} is not a directory: expected a local checkpoint directory "
        f"or a Hub repository as '{HUB_PREFIX}<org>/<name>[@<revision>]'")
    if weights:
      _check_model_files(path, str(path))
    return path

  import huggingface_hub
  from huggingface_hub import errors

  spec = name_or_path
  repo_id, revision = parse_hub_spec(spec)
  if cache_dir is None:
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
  patterns = list(MODEL_FILE_PATTERNS if weights else TOKENIZER_FILE_PATTERNS)
  kwargs = dict(repo_id=repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns)
  # The cache first (see the module docstring): a complete cached snapshot is the answer.
  try:
    path = Path(huggingface_hub.snapshot_download(**kwargs, local_files_only=True))
  except errors.LocalEntryNotFoundError:
    path = None
  if path is None or (weights and _model_files_missing(path)):
    if offline():
      raise FileNotFoundError(
        f"{spec}: {repo_id!r} (revision {revision or 'main'}) is not (completely) in the Hub cache "
        f"{cache_location(cache_dir)} and HF_HUB_OFFLINE is set: go "
        "online once (unset HF_HUB_OFFLINE) to download it, download it elsewhere into this "
        "cache (`hf download`), or pass a local checkpoint directory instead")
    path = Path(_download(spec, kwargs))
  if weights:
    _check_model_files(path, spec)
  return path


def _download(spec: str, kwargs: dict) -> str:
  """`snapshot_download` online, its errors turned into ones that say what to do."""
  import huggingface_hub
  from huggingface_hub import errors

  repo_id = kwargs["repo_id"]
  try:
    return huggingface_hub.snapshot_download(**kwargs)
  except errors.GatedRepoError:
    raise FileNotFoundError(
      f"{spec}: {repo_id!r} is gated: accept its licence on huggingface.co, then set HF_TOKEN "
      "(or run `hf auth login`); or pass a local checkpoint directory") from None
  except errors.RepositoryNotFoundError:
    raise FileNotFoundError(
      f"{spec}: repository {repo_id!r} not found on the Hub (or private): check the id, set "
      "HF_TOKEN for a private repository, or pass a local checkpoint directory") from None
  except errors.RevisionNotFoundError:
    raise FileNotFoundError(
      f"{spec}: repository {repo_id!r} has no revision {kwargs['revision'] or 'main'!r}: "
      "expected a branch, tag or commit hash of it") from None
  except (errors.LocalEntryNotFoundError, errors.HfHubHTTPError) as e:
    raise FileNotFoundError(
      f"{spec}: could not download {repo_id!r} and it is not cached ({type(e).__name__}: "
      f"{str(e).splitlines()[0] if str(e) else ''}): check the network (or HF_ENDPOINT / "
      "HF_TOKEN), or pass a local checkpoint directory") from None


def offline() -> bool:
  """Whether the Hub client may not use the network: `HF_HUB_OFFLINE` now (the environment, as
  it is when this runs) or as huggingface_hub read it at import."""
  from huggingface_hub import constants

  env = os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE
  return env or bool(constants.HF_HUB_OFFLINE)


def cache_location(cache_dir: str | os.PathLike[str] | None = None) -> str:
  """The Hub cache a download uses: `cache_dir`, else `HF_HUB_CACHE` now, else the client's."""
  from huggingface_hub import constants

  return os.fspath(cache_dir or os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def _model_files_missing(path: Path) -> list[str]:
  missing = [] if (path / CONFIG_FILE).is_file() else [CONFIG_FILE]
  if not any(path.glob("*.safetensors")):
    missing.append("*.safetensors")
  return missing


def _check_model_files(path: Path, source: str) -> None:
  missing = _model_files_missing(path)
  if missing:
    raise FileNotFoundError(
      f"{source}: {path} is missing {' and '.join(missing)}: expected a Hugging Face checkpoint "
      f"directory with {CONFIG_FILE} and model weights as *.safetensors (one file, or shards with "
      "model.safetensors.index.json)")
