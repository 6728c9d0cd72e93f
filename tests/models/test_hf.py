"""Hugging Face checkpoints: logits parity with transformers, round trips, errors."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.models import CausalLM, default_positions
from jaxrl_post.models.hf import CheckpointError, load_hf, save_hf
from jaxrl_post.models.model_config import ModelConfig
from jaxrl_post.models.safetensors_io import write_checkpoint

# Small random configs of each family; each switches on the family's quirk
# and uses sizes where a transposed or mis-grouped tensor cannot go unnoticed
# (head_dim ≠ hidden / heads, 2 query heads per kv head, odd vocab).
_COMMON = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
HF_CONFIGS = {
  "llama": lambda: transformers.LlamaConfig(
    **_COMMON, head_dim=16, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
    rope_theta=500_000.0,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                      high_freq_factor=4.0, original_max_position_embeddings=32)),
  "qwen2": lambda: transformers.Qwen2Config(**_COMMON, tie_word_embeddings=True,
                                            rope_theta=1_000_000.0),
  "qwen3": lambda: transformers.Qwen3Config(**_COMMON, head_dim=20, tie_word_embeddings=False,
                                            rope_theta=1_000_000.0),
  "smollm3": lambda: transformers.SmolLM3Config(**_COMMON, tie_word_embeddings=True,
                                                rope_theta=5_000_000.0),  # layer 3 is NoPE
}


def _hf_model(family: str, seed: int = 0):
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[family](),
                                                        attn_implementation="eager")
  with torch.no_grad():  # Norm scales and biases away from their 1 / 0 init.
    for name, p in model.named_parameters():
      p.add_(0.05 * torch.randn_like(p)) if ("norm" in name or "bias" in name) else None
  return model.eval()


def _batch(vocab=97, batch=3, length=21, seed=0):
  rng = np.random.RandomState(seed)
  tokens = rng.randint(0, vocab, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), bool)
  mask[1, :5] = False
  mask[2, :13] = False
  tokens[~mask] = 0
  return tokens, mask


def _hf_logits(model, tokens, mask):
  # Left padding: transformers needs explicit positions counted per row.
  positions = np.asarray(default_positions(jnp.asarray(mask)))
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.float().numpy()


@nnx.jit
def _ours(model, tokens, mask):
  return model(tokens, attention_mask=mask)


def _max_diff(ours, ref, mask):
  return float(np.abs(np.asarray(ours) - ref)[mask].max())


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def hf_checkpoint(request, tmp_path_factory):
  """(family, transformers model, directory saved with save_pretrained)."""
  model = _hf_model(request.param)
  directory = tmp_path_factory.mktemp(f"hf_{request.param}")
  model.save_pretrained(directory)
  return request.param, model, directory


@pytest.mark.parametrize("padded", [False, True])
def test_logits_match_transformers(hf_checkpoint, padded):
  _, hf_model, directory = hf_checkpoint
  tokens, mask = _batch()
  if not padded:
    mask = np.ones_like(mask)
  model = load_hf(directory, attention_impl="plain")
  assert _max_diff(_ours(model, tokens, mask), _hf_logits(hf_model, tokens, mask), mask) <= 1e-4


def test_xla_attention_path_matches_transformers(hf_checkpoint):
  _, hf_model, directory = hf_checkpoint
  tokens, mask = _batch(seed=1)
  model = load_hf(directory, attention_impl="xla")
  assert _max_diff(_ours(model, tokens, mask), _hf_logits(hf_model, tokens, mask), mask) <= 1e-4


def test_sharded_checkpoint_loads(hf_checkpoint, tmp_path):
  _, hf_model, _ = hf_checkpoint
  hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
  assert (tmp_path / "model.safetensors.index.json").exists()
  assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
  tokens, mask = _batch(seed=2)
  model = load_hf(tmp_path)
  assert _max_diff(_ours(model, tokens, mask), _hf_logits(hf_model, tokens, mask), mask) <= 1e-4


@pytest.mark.parametrize("max_shard_bytes", [None, 30_000])
def test_save_hf_round_trip_through_transformers(hf_checkpoint, tmp_path, max_shard_bytes):
  """load_hf → save_hf → transformers.from_pretrained → same logits."""
  _, _, directory = hf_checkpoint
  model = load_hf(directory)
  save_hf(model, tmp_path / "out", max_shard_bytes=max_shard_bytes)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "out", dtype=torch.float32, attn_implementation="eager").eval()
  tokens, mask = _batch(seed=3)
  assert _max_diff(_ours(model, tokens, mask), _hf_logits(reloaded, tokens, mask), mask) <= 1e-4
  # And back into jaxrl_post: bit-identical parameters.
  again = load_hf(tmp_path / "out")
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(a, b)


def test_bfloat16_checkpoint(tmp_path):
  model = _hf_model("qwen3").to(torch.bfloat16)
  model.save_pretrained(tmp_path)
  ours = load_hf(tmp_path, dtype=jnp.bfloat16, compute_dtype=jnp.float32)
  assert ours.layers[0].attn.q_proj[...].dtype == jnp.bfloat16
  # bf16 weights upcast to float32 on both sides: the same numbers. (Reload
  # rather than `model.float()`: `.to(bfloat16)` also rounded transformers'
  # RoPE frequency buffer.)
  reference = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
  tokens, mask = _batch(seed=4)
  ref = _hf_logits(reference, tokens, mask)
  assert _max_diff(_ours(ours, tokens, mask), ref, mask) <= 1e-4
  save_hf(ours, tmp_path / "bf16")
  header = json.loads((tmp_path / "bf16" / "config.json").read_text())
  assert header["torch_dtype"] == "bfloat16"


def test_load_with_mesh_places_each_tensor(tmp_path):
  model = _hf_model("llama")
  model.save_pretrained(tmp_path)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  ours = load_hf(tmp_path, mesh=mesh)
  q_proj = ours.layers[0].attn.q_proj.get_value()
  assert q_proj.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert len(q_proj.sharding.device_set) == 8
  tokens, mask = _batch(seed=5)
  assert _max_diff(_ours(ours, tokens, mask), _hf_logits(model, tokens, mask), mask) <= 1e-4


# ==== sharded loading: each device its shard, each host its slices ====

_MESHES = {
  "fsdp8": ((8,), ("fsdp",)),
  "fsdp4_tensor2": ((4, 2), ("fsdp", "tensor")),
  "data2_fsdp2_tensor2": ((2, 2, 2), ("data", "fsdp", "tensor")),  # replicas over data
}


def _mesh(name):
  shape, names = _MESHES[name]
  return Mesh(np.array(jax.devices()[:8]).reshape(shape), names)


def _shards(sharding):
  """How many distinct blocks a `NamedSharding` cuts an array into."""
  axes = [a for entry in sharding.spec if entry is not None
          for a in ((entry,) if isinstance(entry, str) else entry)]
  return int(np.prod([sharding.mesh.shape[a] for a in axes]))


class _CountingReads:
  """Records every `read_slice` (name, bytes); a whole-tensor `read` is an error."""

  def __init__(self, monkeypatch):
    from jaxrl_post.models.safetensors_io import CheckpointReader
    self.reads = []
    original = CheckpointReader.read_slice

    def read_slice(reader, name, index):
      block = original(reader, name, index)
      self.reads.append((name, block.nbytes))
      return block

    def read(reader, name):
      raise AssertionError(f"sharded load read the whole tensor {name}")

    monkeypatch.setattr(CheckpointReader, "read_slice", read_slice)
    monkeypatch.setattr(CheckpointReader, "read", read)


@pytest.mark.parametrize("mesh_name", sorted(_MESHES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_sharded_load_reads_only_each_shard(family, dtype, mesh_name, tmp_path, monkeypatch):
  """Equal to the unsharded load, placed by the rules, and each read is one shard's bytes.

  The tiny model's dimensions (embed 48, 4 heads, 2 kv heads, mlp 80) divide
  every mesh here, so every weight matrix is cut into one block per device
  over fsdp × tensor (vocab 97 is not divisible: embed / lm_head are cut over
  fsdp only). A read then holds exactly 1/shards of the tensor (1/8 on the
  8-device meshes without data), and a tensor's reads add up to it once:
  replicas (over the data axis) share one read.
  """
  from jaxrl_post.models.hf import tensor_specs
  from jaxrl_post.models.safetensors_io import CheckpointReader
  from jaxrl_post.parallel.axes import logical_sharding
  _hf_model(family).save_pretrained(tmp_path)
  reference = load_hf(tmp_path, dtype=dtype)
  sizes = {name: np.dtype(np.float32).itemsize * int(np.prod(shape))
           for name, (_, shape) in ((n, CheckpointReader(tmp_path).dtype_and_shape(n))
                                    for n in CheckpointReader(tmp_path).names())}
  mesh = _mesh(mesh_name)
  counter = _CountingReads(monkeypatch)
  ours = load_hf(tmp_path, dtype=dtype, mesh=mesh)
  monkeypatch.undo()

  expected = dict(nnx.to_flat_state(nnx.state(reference, nnx.Param)))
  shardings = {}
  for path, variable in nnx.to_flat_state(nnx.state(ours, nnx.Param)):
    array = variable.get_value()
    assert array.dtype == dtype, path
    want = logical_sharding(variable.get_metadata()["out_sharding"], mesh, shape=array.shape)
    assert array.sharding == want, path
    shardings[path] = want
    np.testing.assert_array_equal(np.asarray(array), np.asarray(expected[path].get_value()))
  # Parameters are not split over `data`: with data=2 a weight is cut in 4 blocks.
  blocks = mesh.size // mesh.shape.get("data", 1)
  assert _shards(shardings[("layers", 0, "attn", "q_proj")]) == blocks

  by_name = {}
  for name, nbytes in counter.reads:
    by_name.setdefault(name, []).append(nbytes)
  config = ours.config
  for spec in tensor_specs(config):
    shards = _shards(shardings[spec.path])
    assert by_name[spec.hf_name] == [sizes[spec.hf_name] // shards] * shards, spec.hf_name
  matrices = [s.hf_name for s in tensor_specs(config) if len(s.hf_shape) == 2
              and config.vocab_size not in s.hf_shape]
  assert matrices and all(max(by_name[n]) * blocks == sizes[n] for n in matrices)


_needs_scan = pytest.mark.skipif(
  "scan_layers" not in {f.name for f in dataclasses.fields(ModelConfig)},
  reason="ModelConfig.scan_layers not available")


@_needs_scan
@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_scanned_layers_load_save_and_match_transformers(family, tmp_path):
  """scan_layers=True: each stacked leaf is the unrolled layers stacked, logits match
  transformers, and save_hf unstacks into a checkpoint that transformers and the
  unrolled load read back bit for bit."""
  hf_model = _hf_model(family)
  hf_model.save_pretrained(tmp_path / "in")
  unrolled = load_hf(tmp_path / "in", attention_impl="plain")
  scanned = load_hf(tmp_path / "in", attention_impl="plain", scan_layers=True)
  assert scanned.config.scan_layers
  stacked = dict(nnx.to_flat_state(nnx.state(scanned, nnx.Param)))
  for path, variable in nnx.to_flat_state(nnx.state(unrolled, nnx.Param)):
    if path[0] == "layers":
      layer, rest = path[1], path[2:]
      np.testing.assert_array_equal(stacked[("layers", *rest)].get_value()[layer],
                                    variable.get_value())
    else:
      np.testing.assert_array_equal(stacked[path].get_value(), variable.get_value())
  tokens, mask = _batch(seed=6)
  assert _max_diff(_ours(scanned, tokens, mask), _hf_logits(hf_model, tokens, mask), mask) <= 1e-4

  save_hf(scanned, tmp_path / "out", max_shard_bytes=30_000)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "out", dtype=torch.float32, attn_implementation="eager").eval()
  assert _max_diff(_ours(scanned, tokens, mask), _hf_logits(reloaded, tokens, mask), mask) <= 1e-4
  again = load_hf(tmp_path / "out", attention_impl="plain")
  for a, b in zip(jax.tree.leaves(nnx.state(unrolled)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(a, b)


@_needs_scan
def test_scanned_sharded_load_reads_each_layers_shard(tmp_path, monkeypatch):
  """A stacked leaf on fsdp × tensor: `[layers, ...]` with the layer axis whole; each
  device's block is read as one shard-sized slice per layer, never a whole tensor."""
  from jaxrl_post.models.hf import tensor_specs
  from jaxrl_post.models.safetensors_io import CheckpointReader
  _hf_model("qwen3").save_pretrained(tmp_path)
  reference = load_hf(tmp_path, scan_layers=True, dtype=jnp.bfloat16)
  mesh = _mesh("fsdp4_tensor2")
  counter = _CountingReads(monkeypatch)
  ours = load_hf(tmp_path, scan_layers=True, dtype=jnp.bfloat16, mesh=mesh)
  monkeypatch.undo()
  q_proj = ours.layers.attn.q_proj.get_value()
  assert q_proj.shape == (4, 48, 4, 20)
  assert q_proj.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  expected = dict(nnx.to_flat_state(nnx.state(reference, nnx.Param)))
  for path, variable in nnx.to_flat_state(nnx.state(ours, nnx.Param)):
    np.testing.assert_array_equal(np.asarray(variable.get_value()),
                                  np.asarray(expected[path].get_value()))
  reader = CheckpointReader(tmp_path)
  reads = {}
  for name, nbytes in counter.reads:
    reads.setdefault(name, []).append(nbytes)
  for spec in tensor_specs(ours.config):
    if spec.hf_name.endswith("q_proj.weight"):
      size = 4 * int(np.prod(reader.dtype_and_shape(spec.hf_name)[1]))
      assert reads[spec.hf_name] == [size // 8] * 8, spec.hf_name


def test_read_block_is_the_block_of_the_converted_tensor(tmp_path):
  """`TensorSpec.read_block` on random blocks (a single head, part of head_dim,
  ranges no mesh would cut) equals converting the whole tensor and slicing it."""
  from jaxrl_post.models.hf import tensor_specs
  from jaxrl_post.models.safetensors_io import CheckpointReader
  _hf_model("llama").save_pretrained(tmp_path)
  reader = CheckpointReader(tmp_path)
  model = load_hf(tmp_path)
  rng = np.random.RandomState(0)
  for spec in tensor_specs(model.config):
    whole = spec.to_ours(reader.read(spec.hf_name))
    for _ in range(6):
      index = []
      for size in spec.shape:
        start = rng.randint(0, size)
        index.append(slice(start, rng.randint(start + 1, size + 1)))
      np.testing.assert_array_equal(spec.read_block(reader, tuple(index)),
                                    whole[tuple(index)], err_msg=f"{spec.hf_name} {index}")
    np.testing.assert_array_equal(spec.to_hf(whole), reader.read(spec.hf_name))


def test_read_slice_checks_the_index(tmp_path):
  from jaxrl_post.models.safetensors_io import CheckpointReader
  _hf_model("llama").save_pretrained(tmp_path)
  reader = CheckpointReader(tmp_path)
  name = "model.norm.weight"
  np.testing.assert_array_equal(reader.read_slice(name, (slice(2, 5),)), reader.read(name)[2:5])
  with pytest.raises(ValueError, match=r"model\.norm\.weight.*2 entries, expected 1"):
    reader.read_slice(name, (slice(0, 1), slice(0, 1)))
  with pytest.raises(ValueError, match="unit-step"):
    reader.read_slice(name, (slice(0, 4, 2),))
  with pytest.raises(ValueError, match="out of bounds"):
    reader.read_slice(name, (slice(0, 49),))


# ==== bad checkpoints: one clear error each ====


@pytest.fixture
def llama_dir(tmp_path):
  _hf_model("llama").save_pretrained(tmp_path / "ckpt")
  return tmp_path / "ckpt"


def _rewrite_tensors(directory, edit):
  from jaxrl_post.models.safetensors_io import CheckpointReader
  reader = CheckpointReader(directory)
  tensors = {name: np.array(reader.read(name)) for name in reader.names()}
  del reader
  edit(tensors)
  (directory / "model.safetensors").unlink()
  write_checkpoint(directory, tensors)


def _edit_config(directory, **changes):
  path = directory / "config.json"
  config = json.loads(path.read_text())
  config.update(changes)
  path.write_text(json.dumps(config))


def test_missing_config_json(llama_dir):
  (llama_dir / "config.json").unlink()
  with pytest.raises(CheckpointError, match="no config.json"):
    load_hf(llama_dir)


def test_missing_weights(llama_dir):
  (llama_dir / "model.safetensors").unlink()
  with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index"):
    load_hf(llama_dir)


def test_missing_tensor(llama_dir):
  _rewrite_tensors(llama_dir, lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
  with pytest.raises(CheckpointError, match=r"missing 1 tensor.*layers\.2\.mlp\.up_proj"):
    load_hf(llama_dir)


def test_unexpected_tensor(llama_dir):
  def add(tensors):
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros((2,), np.float32)
  _rewrite_tensors(llama_dir, add)
  with pytest.raises(CheckpointError, match=r"1 unexpected tensor.*self_attn\.extra\.weight"):
    load_hf(llama_dir)


@pytest.mark.parametrize("mesh_name", [None, "fsdp8"])
def test_shape_mismatch(llama_dir, mesh_name):
  def shrink(tensors):
    tensors["model.layers.1.self_attn.k_proj.weight"] = np.zeros((16, 48), np.float32)
  _rewrite_tensors(llama_dir, shrink)
  with pytest.raises(CheckpointError,
                     match=r"k_proj\.weight: shape \[16, 48\].*\[32, 48\] expected"):
    load_hf(llama_dir, mesh=mesh_name and _mesh(mesh_name))


def test_dtype_mismatch(llama_dir):
  def to_int(tensors):
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.int32)
  _rewrite_tensors(llama_dir, to_int)
  with pytest.raises(CheckpointError, match=r"model\.norm\.weight: dtype I32"):
    load_hf(llama_dir)


@pytest.mark.parametrize("changes, message", [
  (dict(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "unsupported architectures"),
  (dict(architectures=["MistralForCausalLM"]), "unsupported architectures"),
  (dict(hidden_act="gelu"), "hidden_act='gelu'"),
  (dict(rope_scaling=dict(rope_type="yarn", factor=4.0)), "rope_scaling type 'yarn'"),
  (dict(use_sliding_window=True), "use_sliding_window"),
])
def test_unsupported_config(llama_dir, changes, message):
  _edit_config(llama_dir, **changes)
  with pytest.raises(CheckpointError, match=message):
    load_hf(llama_dir)


def test_missing_shard_file(hf_checkpoint, tmp_path):
  _, hf_model, _ = hf_checkpoint
  hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
  shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
  shard.unlink()
  with pytest.raises(CheckpointError, match=f"lists shard {shard.name}, which does not exist"):
    load_hf(tmp_path)


def test_truncated_file(llama_dir):
  path = llama_dir / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match="does not match shape"):
    load_hf(llama_dir)


def test_not_a_directory_copy_is_untouched(llama_dir, tmp_path):
  """Loading never writes into the checkpoint directory."""
  before = {p.name: p.stat().st_mtime_ns for p in llama_dir.iterdir()}
  load_hf(llama_dir)
  assert {p.name: p.stat().st_mtime_ns for p in llama_dir.iterdir()} == before
  shutil.rmtree(llama_dir)


def test_model_built_from_loaded_config_is_a_causal_lm(llama_dir):
  model = load_hf(llama_dir)
  assert isinstance(model, CausalLM)
  assert model.config.rope_scaling.rope_type == "llama3"
  assert model.config.qkv_bias and model.config.o_bias and model.config.mlp_bias


def test_indivisible_dimension_is_replicated(tmp_path):
  """vocab 97 over 2 tensor shards: that dimension stays whole, the rest shard."""
  _hf_model("qwen2").save_pretrained(tmp_path)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  ours = load_hf(tmp_path, mesh=mesh)
  assert ours.embed.get_value().sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
