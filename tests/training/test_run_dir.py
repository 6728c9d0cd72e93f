"""`training.run_dir`: a run's config, policy at a checkpoint step and tokenizer, read back."""

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.sft import SFT
from jaxrl_post.training import loop
from jaxrl_post.training.run_dir import checkpoint_steps, load_run, read_config, resolve_step

ROOT = Path(__file__).resolve().parents[2]


def sft_runlocal_config(**changes):
  """configs/sft_arith.py:runlocal, cut to `changes` (a test's own run)."""
  module = load_module(ROOT / "configs" / "sft_arith.py", "sft_arith")
  config = module.get_config("runlocal")
  config.compilation_cache_dir = ""
  config.update(changes)
  return config


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """Two SFT steps of `tiny`, checkpoints at steps 1 and 2; the final train state."""
  workdir = tmp_path_factory.mktemp("sft_run")
  config = sft_runlocal_config(steps=2, checkpoint_every=1, eval_every=100, eval_examples=2,
                               eval_max_new_tokens=4)
  state = loop.train(config, workdir, SFT(config))
  return workdir, jax.device_get(state.params)


def _leaves(model):
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_load_run_holds_the_checkpointed_parameters(finished_run):
  workdir, final_params = finished_run
  assert checkpoint_steps(workdir) == [1, 2]
  run = load_run(workdir)
  assert run.step == 2 and run.config.task == "arith" and run.config.model == "tiny"
  assert run.tokenizer.vocab_size <= run.model.config.vocab_size
  for got, want in zip(_leaves(run.model), jax.tree.leaves(final_params), strict=True):
    np.testing.assert_array_equal(got, want)
  first = load_run(workdir, step=1)
  assert first.step == 1
  assert any(not np.array_equal(a, b) for a, b in zip(_leaves(first.model), _leaves(run.model)))


def test_load_run_on_a_mesh_lands_sharded(finished_run):
  workdir, final_params = finished_run
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  run = load_run(workdir, mesh=mesh)
  leaves = jax.tree.leaves(nnx.state(run.model, nnx.Param))
  assert all(isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh for x in leaves)
  for got, want in zip(leaves, jax.tree.leaves(final_params), strict=True):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_errors_name_the_file_and_list_the_steps(finished_run, tmp_path):
  workdir, _ = finished_run
  with pytest.raises(FileNotFoundError, match="config.json not found"):
    read_config(tmp_path)
  with pytest.raises(FileNotFoundError, match="config.json not found"):
    load_run(tmp_path)
  (tmp_path / "config.json").write_text((workdir / "config.json").read_text())
  with pytest.raises(FileNotFoundError, match="no checkpoint in"):
    load_run(tmp_path)
  with pytest.raises(ValueError, match=r"step 7 has no checkpoint .*steps there: 1, 2"):
    resolve_step(workdir, 7)
