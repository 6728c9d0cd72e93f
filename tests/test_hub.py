"""`hub.resolve_model_dir`: local directories, the Hub cache offline, and the errors users see.

No network here: a stand-in Qwen3 checkpoint (`standin.write_standin_checkpoint`) is laid out as
the Hub client's cache (`stage_in_hub_cache`) and read back with `HF_HUB_OFFLINE=1`; the online
branch is exercised by replacing `huggingface_hub.snapshot_download`.
"""

import shutil

import huggingface_hub
import pytest
from huggingface_hub import errors

from jaxrl_post import hub
from jaxrl_post import tokenizers as tk
from jaxrl_post.standin import END_OF_TURN, PAD_TOKEN

REPO = "Qwen/Qwen3-0.6B"


@pytest.fixture(scope="module")
def cache(staged_hub):
  """The stand-in staged as `REPO` (tests/conftest.py): (cache, snapshot)."""
  return staged_hub


@pytest.fixture
def offline(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_local_directory_is_returned_as_is(standin):
  assert hub.resolve_model_dir(standin) == standin
  assert hub.resolve_model_dir(str(standin), weights=False) == standin


def test_local_directory_without_weights_names_what_is_missing(tmp_path, standin):
  shutil.copy(standin / "tokenizer.json", tmp_path)
  with pytest.raises(FileNotFoundError, match=r"missing config\.json and \*\.safetensors: "
                     r"expected a Hugging Face checkpoint directory"):
    hub.resolve_model_dir(tmp_path)
  assert hub.resolve_model_dir(tmp_path, weights=False) == tmp_path  # a tokenizer-only dir
  with pytest.raises(FileNotFoundError, match="is not a directory: expected a local checkpoint"):
    hub.resolve_model_dir(tmp_path / "nope")


def test_hub_spec_resolves_to_the_cached_snapshot_offline(cache, offline):
  cache_dir, snapshot = cache
  path = hub.resolve_model_dir(f"hf:{REPO}", cache_dir=cache_dir)
  assert path == snapshot
  assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
          "chat_template.jinja"} <= {p.name for p in path.iterdir()}
  # A branch and the commit hash itself name the same snapshot.
  assert hub.resolve_model_dir(f"hf:{REPO}@main", cache_dir=cache_dir) == snapshot
  assert hub.resolve_model_dir(f"hf:{REPO}@{'0' * 40}", cache_dir=cache_dir) == snapshot


def test_hf_hub_cache_set_after_import_is_honoured(cache, offline, monkeypatch):
  # `huggingface_hub.constants` read HF_HUB_CACHE when it was imported; resolve_model_dir reads
  # the variable at call time, so setting it in a running process (a notebook) works too.
  cache_dir, snapshot = cache
  monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
  assert huggingface_hub.constants.HF_HUB_CACHE != str(cache_dir)
  assert hub.resolve_model_dir(f"hf:{REPO}") == snapshot


def test_unknown_repo_offline_names_it_and_what_to_do(cache, offline):
  cache_dir, _ = cache
  with pytest.raises(FileNotFoundError) as info:
    hub.resolve_model_dir("hf:Qwen/Qwen3-9999B", cache_dir=cache_dir)
  message = str(info.value)
  assert "'Qwen/Qwen3-9999B'" in message and "HF_HUB_OFFLINE is set" in message
  assert "unset HF_HUB_OFFLINE" in message and "local checkpoint directory" in message
  # A revision that is not cached is not silently replaced by another one.
  with pytest.raises(FileNotFoundError, match="revision v2"):
    hub.resolve_model_dir(f"hf:{REPO}@v2", cache_dir=cache_dir)


@pytest.mark.parametrize("spec, why", [
  ("hf:", "no organisation"),
  ("hf:Qwen3-0.6B", "no organisation"),
  (f"hf:{REPO}@", "empty revision"),
  ("hf:Qwen/Qwen 3", "not a valid repository id"),
  ("hf:a/b/c", "not a valid repository id"),
])
def test_malformed_specs(spec, why):
  with pytest.raises(ValueError, match=f"{why}.*expected 'hf:<org>/<name>'"):
    hub.parse_hub_spec(spec)


def test_parse_hub_spec():
  assert hub.parse_hub_spec(f"hf:{REPO}") == (REPO, None)
  assert hub.parse_hub_spec(f"hf:{REPO}@refs/pr/1") == (REPO, "refs/pr/1")
  assert hub.is_hub_spec("hf:a/b") and not hub.is_hub_spec("/data/hf:a") and not hub.is_hub_spec(1)


def test_cached_snapshot_needs_no_network(cache, monkeypatch):
  """Online, a complete cached snapshot is used without asking the Hub (resumed runs)."""
  cache_dir, snapshot = cache
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
  real = huggingface_hub.snapshot_download
  calls = []

  def no_network(*args, **kwargs):
    calls.append(kwargs["local_files_only"])
    if not kwargs["local_files_only"]:
      raise AssertionError("resolve_model_dir went online although the snapshot is cached")
    return real(*args, **kwargs)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
  assert hub.resolve_model_dir(f"hf:{REPO}", cache_dir=cache_dir) == snapshot
  assert calls == [True]


def _not_found(cls):
  import httpx2  # huggingface_hub's HTTP client; its errors carry a response

  response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/api"))
  return cls("404 Client Error", response=response)


@pytest.mark.parametrize("error, expected", [
  (errors.RepositoryNotFoundError, r"repository 'acme/missing' not found on the Hub.*HF_TOKEN"),
  (errors.GatedRepoError, r"'acme/missing' is gated.*set HF_TOKEN"),
  (errors.RevisionNotFoundError, r"no revision 'main': expected a branch, tag or commit"),
])
def test_online_errors_say_what_to_do(tmp_path, monkeypatch, error, expected):
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

  def fake(repo_id, *, local_files_only=False, **kwargs):
    if local_files_only:
      raise errors.LocalEntryNotFoundError("not cached")
    raise _not_found(error)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
  with pytest.raises(FileNotFoundError, match=expected):
    hub.resolve_model_dir("hf:acme/missing", cache_dir=tmp_path)


def test_downloaded_snapshot_without_weights_is_an_error(tmp_path, monkeypatch):
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

  def fake(repo_id, *, local_files_only=False, **kwargs):
    if local_files_only:
      raise errors.LocalEntryNotFoundError("not cached")
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
  with pytest.raises(FileNotFoundError, match=r"hf:acme/bin: .* missing \*\.safetensors"):
    hub.resolve_model_dir("hf:acme/bin")


def test_tokenizer_files(standin, tmp_path):
  files = hub.tokenizer_files(standin)
  assert files.missing == ()
  assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
          "generation_config.json"} == set(files.present)
  shutil.copy(standin / "tokenizer_config.json", tmp_path)
  assert hub.tokenizer_files(tmp_path) == (("tokenizer_config.json",), ("tokenizer.json",))
  with pytest.raises(FileNotFoundError, match=(
      rf"config.init_from='x' → {tmp_path} is missing the tokenizer file\(s\) tokenizer.json: "
      r"expected tokenizer.json \(and optionally .*\); present: tokenizer_config.json")):
    hub.require_tokenizer_files(tmp_path, source="config.init_from='x'")


def test_get_tokenizer_from_the_hub_cache(cache, offline, monkeypatch, standin):
  cache_dir, snapshot = cache
  monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
  tok = tk.get_tokenizer(f"hf:{REPO}")
  assert isinstance(tok, tk.HFTokenizer) and tok.source_dir == str(snapshot)
  assert tok.encode("12 apples") == tk.HFTokenizer.from_dir(standin).encode("12 apples")
  with pytest.raises(FileNotFoundError, match=r"'acme/none'.*not \(completely\) in the Hub cache"):
    tk.get_tokenizer("hf:acme/none")


def test_end_ids(standin):
  tok = tk.HFTokenizer.from_dir(standin)
  # eos_token is <|im_end|>; generation_config.json adds <|endoftext|> (listed after it).
  assert tok.end_ids == (tok.token_to_id(END_OF_TURN), tok.token_to_id(PAD_TOKEN))
  assert tok.eos_id == tok.end_ids[0] and tok.source_dir == str(standin)
  assert tk.CharTokenizer().end_ids == (tk.CharTokenizer().eos_id,)
  assert isinstance(tok, tk.Tokenizer) and isinstance(tk.CharTokenizer(), tk.Tokenizer)


def test_end_ids_from_an_int_and_bad_values(standin, tmp_path):
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(standin / name, tmp_path)
  assert tk.HFTokenizer.from_dir(tmp_path).end_ids == (2,)  # no generation_config.json
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": 0}')
  assert tk.HFTokenizer.from_dir(tmp_path).end_ids == (2, 0)
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 2]}')
  assert tk.HFTokenizer.from_dir(tmp_path).end_ids == (2,)
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": "<|im_end|>"}')
  with pytest.raises(ValueError, match="generation_config.json must be an int or a list"):
    tk.HFTokenizer.from_dir(tmp_path)
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": 100000}')
  with pytest.raises(ValueError, match=r"end-of-turn id 100000 .* outside its vocabulary"):
    tk.HFTokenizer.from_dir(tmp_path)
