"""The binaries' persistent compilation cache (`training.setup.enable_compilation_cache`)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxrl_post.training import setup as run_setup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_jax_cache_config():
  saved = {k: jax.config.values[k] for k in ("jax_compilation_cache_dir",
                                             "jax_compilation_cache_max_size")}
  yield
  for key, value in saved.items():
    jax.config.update(key, value)


def test_empty_path_leaves_jax_alone(restore_jax_cache_config):
  jax.config.update("jax_compilation_cache_dir", "/somewhere/else")
  run_setup.enable_compilation_cache("")
  assert jax.config.values["jax_compilation_cache_dir"] == "/somewhere/else"


def test_sets_the_directory_and_the_bound(restore_jax_cache_config, tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  run_setup.enable_compilation_cache("~/cache/xla", max_bytes=1 << 20)
  assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "cache" / "xla")
  assert jax.config.values["jax_compilation_cache_max_size"] == 1 << 20
  assert (tmp_path / "cache" / "xla").is_dir()


def test_a_path_that_cannot_be_created_names_the_config_key(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="config.compilation_cache_dir"):
    run_setup.enable_compilation_cache(str(tmp_path / "file" / "cache"))


def _entries(cache: Path) -> set[str]:
  return {p.name for p in cache.glob("*-cache")}


@pytest.mark.slow
def test_a_resumed_run_and_a_repeated_run_compile_nothing_new(tmp_path):
  cache = tmp_path / "cache"
  # Every program is written (not only those that took ≥ 1 s), so "nothing new" is strict.
  env = dict(os.environ, XLA_FLAGS="", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")

  def sft(workdir):
    command = [sys.executable, str(ROOT / "experiments" / "sft.py"),
               f"--config={ROOT / 'configs' / 'sft_arith.py'}:runlocal", f"--workdir={workdir}",
               f"--config.compilation_cache_dir={cache}", "--verbosity=-1"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]

  sft(tmp_path / "first")
  programs = _entries(cache)
  assert programs, "the first run wrote no compiled programs"
  # A restart: the last checkpoint is gone, the run resumes from the one before it.
  checkpoints = sorted((tmp_path / "first" / "checkpoints").iterdir(), key=lambda p: int(p.name))
  assert len(checkpoints) == 2
  shutil.rmtree(checkpoints[-1])
  sft(tmp_path / "first")
  assert _entries(cache) == programs
  sft(tmp_path / "second")  # the same run again, in a new workdir
  assert _entries(cache) == programs
