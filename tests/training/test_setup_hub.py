"""`setup` with `init_from="hf:..."`, `tokenizer="init_from"` and `chat_template=True`.

The stand-in Qwen3 checkpoint is staged in a temporary Hub cache and read with
`HF_HUB_OFFLINE=1` (or with the online path forbidden), as a run on a machine without network
would after its first download.
"""

import huggingface_hub
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxrl_post import tokenizers
from jaxrl_post.models.hf import load_hf
from jaxrl_post.tasks.chat import ChatTask
from jaxrl_post.training import base_configs
from jaxrl_post.training import setup as run_setup

REPO = "Qwen/Qwen3-0.6B"


@pytest.fixture(scope="module")
def staged(staged_hub):
  return staged_hub


@pytest.fixture
def cache(staged, monkeypatch):
  """The staged cache as HF_HUB_CACHE, offline; returns the snapshot directory."""
  monkeypatch.setenv("HF_HUB_CACHE", str(staged[0]))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return staged[1]


def _config(**changes):
  config = ml_collections.ConfigDict(dict(
    seed=0, tokenizer="init_from", model="tiny", init_from=f"hf:{REPO}", resume="",
    task="arith", chat_template=False, system_prompt="",
    chat_template_kwargs=ml_collections.ConfigDict(dict(enable_thinking=False))))
  config.model_overrides = ml_collections.ConfigDict()
  base_configs.precision_config(config)
  config.update(changes)
  return config


@nnx.jit
def _logits(model, tokens):
  return model(tokens)


@pytest.mark.parametrize("tokenizer", ["init_from", f"hf:{REPO}"])
def test_hub_config_gives_the_logits_of_load_hf(cache, standin, tmp_path, tokenizer):
  config = _config(tokenizer=tokenizer)
  start = run_setup.start_point(config, str(tmp_path))
  assert start.kind == "init_from_hf" and start.path == cache
  tok = run_setup.build_tokenizer(config)
  assert isinstance(tok, tokenizers.HFTokenizer) and tok.source_dir == str(cache)
  model = run_setup.build_model(config, tok, start)
  reference = load_hf(standin)
  prompt = ChatTask(run_setup.build_task(config), tok).make_example("test", 0)["prompt"]
  tokens = np.asarray([tok.encode(prompt)], np.int32)
  np.testing.assert_array_equal(np.asarray(_logits(model, tokens)),
                                np.asarray(_logits(reference, tokens)))


def test_resumed_hub_run_reads_the_cache_only(staged, tmp_path, monkeypatch):
  """A restart finds its own checkpoint and rebuilds its first start from the cache, online
  but without asking the Hub (the snapshot it started from, not a newer upload)."""
  cache_dir, snapshot = staged
  monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
  real = huggingface_hub.snapshot_download

  def cache_only(*args, **kwargs):
    assert kwargs["local_files_only"], "went to the Hub although the snapshot is cached"
    return real(*args, **kwargs)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", cache_only)
  (run_setup.checkpoint_dir(str(tmp_path)) / "7").mkdir(parents=True)  # an orbax step dir
  config = _config(chat_template=True)
  task, tok, start, model = run_setup.build_run(config, str(tmp_path))
  assert (start.kind, start.step) == ("workdir", 7)
  first = run_setup.start_point(config, str(tmp_path), ignore_workdir=True)
  assert first.kind == "init_from_hf" and first.path == snapshot
  assert tok.source_dir == str(snapshot) and model.config.vocab_size == tok.vocab_size
  assert isinstance(task, ChatTask) and task.make_example("train", 0)["prompt"].startswith(
    "<|im_start|>user\n")


def test_chat_template_config(cache):
  config = _config(chat_template=True, system_prompt="Be brief.",
                   chat_template_kwargs=ml_collections.ConfigDict(dict(enable_thinking=True)))
  task = run_setup.build_task(config)  # builds the tokenizer itself (scripts call it so)
  assert isinstance(task, ChatTask)
  assert task.fingerprint()["chat"]["template_kwargs"] == {"enable_thinking": True}
  prompt = task.make_example("train", 0)["prompt"]
  assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
  assert prompt.endswith("<|im_start|>assistant\n")
  assert not isinstance(run_setup.build_task(_config()), ChatTask)


def test_chat_template_errors_name_the_key_and_the_tokenizer(standin, tmp_path):
  with pytest.raises(ValueError, match=r"config.chat_template=True with config.tokenizer='char'"
                                       r".*CharTokenizer\) has no chat template"):
    run_setup.build_task(_config(chat_template=True, tokenizer="char"))
  for name in ("tokenizer.json", "tokenizer_config.json"):
    (tmp_path / name).write_bytes((standin / name).read_bytes())
  (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] | nonexistent }}")
  with pytest.raises(ValueError, match=rf"config.chat_template=True .*\({tmp_path}\) failed to "
                                       "render"):
    run_setup.build_task(_config(chat_template=True, tokenizer=str(tmp_path)))


def test_tokenizer_of_init_from_errors(cache, standin, tmp_path):
  with pytest.raises(ValueError, match=r"config.tokenizer='init_from': .*config.init_from, which "
                                       "is empty"):
    run_setup.build_tokenizer(_config(init_from=""))
  for name in ("config.json", "model.safetensors"):
    (tmp_path / name).write_bytes((standin / name).read_bytes())
  with pytest.raises(FileNotFoundError, match=(
      rf"config.tokenizer='init_from': config.init_from='{tmp_path}' → {tmp_path} is missing "
      r"the tokenizer file\(s\) tokenizer.json: expected tokenizer.json")):
    run_setup.build_tokenizer(_config(init_from=str(tmp_path)))
  # The weights alone still load (the tokenizer may come from elsewhere).
  assert run_setup.start_point(_config(init_from=str(tmp_path)), str(tmp_path / "w")).kind == (
    "init_from_hf")


def test_unknown_repo_offline(cache, tmp_path):
  config = _config(init_from="hf:acme/missing")
  with pytest.raises(FileNotFoundError, match=r"config.init_from='hf:acme/missing': "
                                              r"hf:acme/missing: 'acme/missing' .*in the Hub"):
    run_setup.start_point(config, str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"config.tokenizer='init_from': "
                                              r"config.init_from='hf:acme/missing'"):
    run_setup.build_tokenizer(config)
  with pytest.raises(ValueError, match=r"config.init_from='hf:acme': 'hf:acme' has no "
                                       "organisation"):
    run_setup.start_point(_config(init_from="hf:acme"), str(tmp_path))
