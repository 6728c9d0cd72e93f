"""`setup.build_model` and the train step with the run's dtypes (presets and HF loads)."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import tokenizers
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import save_hf
from jaxrl_post.models.model_config import ModelConfig
from jaxrl_post.training import base_configs
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import StartPoint
from jaxrl_post.training.train_state import create_train_state, make_train_step


def _config(**changes):
  config = ml_collections.ConfigDict(dict(seed=0, tokenizer="char", model="tiny"))
  config.model_overrides = ml_collections.ConfigDict()
  base_configs.precision_config(config)
  config.optimizer = base_configs.optimizer_config(lr=1e-2)
  config.update(changes)
  return config


def _params(model):
  return nnx.to_flat_state(nnx.state(model, nnx.Param))


@pytest.fixture(scope="module")
def tokenizer():
  return tokenizers.get_tokenizer("char")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tokenizer):
  """A float32 `tiny` model saved as a Hugging Face checkpoint."""
  path = tmp_path_factory.mktemp("hf") / "tiny"
  model = CausalLM(get_model_config("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(1))
  save_hf(model, path)
  return path


def test_defaults_are_float32(tokenizer):
  model = run_setup.build_model(_config(), tokenizer, StartPoint("scratch"))
  assert model.config.param_dtype == jnp.float32 and model.config.dtype == jnp.float32
  assert all(v.get_value().dtype == jnp.float32 for _, v in _params(model))


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_preset_in_the_configured_dtypes(tokenizer, param_dtype):
  config = _config(param_dtype=param_dtype, dtype="bfloat16")
  model = run_setup.build_model(config, tokenizer, StartPoint("scratch"))
  assert model.config.param_dtype == jnp.dtype(param_dtype)
  assert model.config.dtype == jnp.bfloat16
  assert all(v.get_value().dtype == jnp.dtype(param_dtype) for _, v in _params(model))


def test_hf_start_in_the_configured_dtypes_born_sharded(tokenizer, hf_dir):
  """`init_from` a HF directory: cast to `param_dtype`, each parameter on the mesh."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tensor"))
  config = _config(param_dtype="bfloat16", dtype="bfloat16")
  model = run_setup.build_model(config, tokenizer, StartPoint("init_from_hf", hf_dir), mesh)
  reference = run_setup.build_model(_config(), tokenizer, StartPoint("init_from_hf", hf_dir))
  assert model.config.param_dtype == jnp.bfloat16 and model.config.dtype == jnp.bfloat16
  for (path, ours), (_, ref) in zip(_params(model), _params(reference)):
    value = ours.get_value()
    assert value.dtype == jnp.bfloat16, path
    assert value.sharding.mesh == mesh, path
    np.testing.assert_array_equal(np.asarray(value),
                                  np.asarray(ref.get_value()).astype(jnp.bfloat16))
  q_proj = model.layers[0].attn.q_proj.get_value()
  assert q_proj.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)


@pytest.mark.skipif("scan_layers" not in {f.name for f in dataclasses.fields(ModelConfig)},
                    reason="ModelConfig.scan_layers not available")
def test_hf_start_takes_the_run_options_of_model_overrides(tokenizer, hf_dir):
  """scan_layers / remat_policy in `model_overrides` apply to a HF start too."""
  config = _config()
  config.model_overrides.scan_layers = True
  config.model_overrides.remat_policy = "full"
  model = run_setup.build_model(config, tokenizer, StartPoint("init_from_hf", hf_dir))
  assert model.config.scan_layers and model.config.remat_policy == "full"
  assert model.layers.attn.q_proj.get_value().shape[0] == model.config.num_layers


@pytest.mark.parametrize("key", ["param_dtype", "dtype"])
def test_unknown_dtype_names_the_key_and_the_valid_names(tokenizer, key):
  with pytest.raises(ValueError,
                     match=rf"config\.{key}='bf16' is not a dtype name; valid: float32, bfloat16"):
    run_setup.build_model(_config(**{key: "bf16"}), tokenizer, StartPoint("scratch"))


def test_dtype_in_model_overrides_points_to_the_config_key(tokenizer):
  config = _config()
  config.model_overrides.param_dtype = "bfloat16"
  with pytest.raises(ValueError, match=r"config\.model_overrides\.param_dtype: set "
                                       r"config\.param_dtype"):
    run_setup.build_model(config, tokenizer, StartPoint("scratch"))


def test_bf16_params_float32_moments_train_step_on_a_mesh(tokenizer):
  """bf16 parameters with float32 Adam moments: moments sharded like their parameters,
  the parameters stay bf16 and move, and every state leaf keeps its dtype (float32
  gradient accumulation must not leak into the state)."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tensor"))
  config = _config(param_dtype="bfloat16", dtype="bfloat16")
  model = run_setup.build_model(config, tokenizer, StartPoint("scratch"), mesh)
  optimizer = run_setup.build_optimizer(config, total_steps=10)
  state = create_train_state(model, optimizer, jax.random.key(0), mesh=mesh)
  params = jax.tree.leaves(state.params)
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
  assert len(moments) == 2 * len(params)
  assert all(m.dtype == jnp.float32 for m in moments)
  shardings = {(p.shape, p.sharding.spec) for p in params}
  assert all((m.shape, m.sharding.spec) in shardings for m in moments)

  def loss_fn(model, batch):
    logits = model(batch["tokens"])
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], axis=-1).sum()
    return nll / batch["tokens"][:, 1:].size * batch["tokens"].shape[0] / 8, {}

  step_fn = make_train_step(nnx.split(model)[0], loss_fn, optimizer, num_micro_batches=2,
                            mesh=mesh)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, tokenizer.vocab_size, (8, 12)),
                       jnp.int32)
  before = [np.asarray(p, np.float32) for p in params]
  dtypes = [x.dtype for x in jax.tree.leaves(state)]
  for _ in range(2):
    state, metrics = step_fn(state, {"tokens": tokens})
  assert int(metrics["skipped"]) == 0
  after = jax.tree.leaves(state.params)
  assert all(p.dtype == jnp.bfloat16 for p in after)
  assert any(not np.array_equal(b, np.asarray(a, np.float32)) for b, a in zip(before, after))
  assert [x.dtype for x in jax.tree.leaves(state)] == dtypes


def test_run_option_keys_apply_to_presets_and_hf_starts(tokenizer, hf_dir):
  """`config.scan_layers` / `remat_policy` / `logit_chunk_size` / `attention_impl` (unset by
  default: the preset's) reach the model, for a preset and an HF checkpoint alike."""
  options = dict(scan_layers=True, remat_policy="dots", logit_chunk_size=16,
                 attention_impl="plain")
  preset = run_setup.build_model(_config(), tokenizer, StartPoint("scratch"))
  assert (preset.config.scan_layers, preset.config.remat_policy) == (False, "none")
  for start in (StartPoint("scratch"), StartPoint("init_from_hf", path=str(hf_dir))):
    model = run_setup.build_model(_config(**options), tokenizer, start)
    assert {k: getattr(model.config, k) for k in options} == options, start.kind
  config = _config(remat_policy="full")
  config.model_overrides.remat_policy = "dots"
  with pytest.raises(ValueError, match="config.remat_policy and config.model_overrides"):
    run_setup.build_model(config, tokenizer, StartPoint("scratch"))
  with pytest.raises(ValueError, match="remat_policy='sometimes'"):
    run_setup.build_model(_config(remat_policy="sometimes"), tokenizer, StartPoint("scratch"))


def test_a_workdir_restart_of_an_hf_run_builds_the_hf_weights(tokenizer, hf_dir, tmp_path):
  # The run's own checkpoint (a step directory) makes it a "workdir" start; the model must
  # still be built from the Hugging Face weights (the starting policy `Method.start` copies).
  (tmp_path / "checkpoints" / "2").mkdir(parents=True)
  config = _config(init_from=str(hf_dir), task="arith", task_knobs={})
  _, _, start, model = run_setup.build_run(config, str(tmp_path))
  assert start.kind == "workdir"
  want = dict(_params(run_setup.build_model(config, tokenizer,
                                            StartPoint("init_from_hf", hf_dir))))
  for key, value in _params(model):
    np.testing.assert_array_equal(np.asarray(value.get_value()),
                                  np.asarray(want[key].get_value()), err_msg=str(key))
