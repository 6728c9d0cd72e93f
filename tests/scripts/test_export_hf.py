"""scripts/export_hf.py: a run's checkpoint → a directory `transformers` loads, same logits."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.methods.sft import SFT
from jaxrl_post.models import default_positions
from jaxrl_post.models.hf import load_hf
from jaxrl_post.training import loop
from jaxrl_post.training.export import export_run, parse_size
from jaxrl_post.training.run_dir import load_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = load_module(ROOT / "scripts" / "export_hf.py", "export_hf")


def _sft_config(**changes):
  config = load_module(ROOT / "configs" / "sft_arith.py").get_config("runlocal")
  config.update(dict(steps=1, checkpoint_every=1, eval_every=100, eval_examples=2,
                     eval_max_new_tokens=4, compilation_cache_dir=""))
  config.optimizer.warmup_steps = 0  # The one update moves the parameters.
  config.update(changes)
  return config


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, standin):
  """One SFT step of a run initialised from a Hub-shaped Qwen3 checkpoint and its tokenizer."""
  workdir = tmp_path_factory.mktemp("sft_from_standin")
  config = _sft_config(init_from=str(standin), tokenizer=str(standin))
  loop.train(config, workdir, SFT(config))
  return workdir


def _export(*flags):
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["export_hf.py", *flags]))


def _tokens():
  tokens = np.array([[5, 17, 42, 9, 3, 77, 101, 8], [0, 0, 12, 13, 14, 15, 16, 17]], np.int32)
  return tokens, tokens != 0


def test_transformers_loads_the_export_with_our_logits(run_dir, standin, tmp_path):
  out = tmp_path / "hf"
  _export(f"--run_dir={run_dir}", f"--out={out}", "--max_shard_size=100KB")
  names = {p.name for p in out.iterdir()}
  assert {"config.json", "model.safetensors.index.json", "tokenizer.json",
          "tokenizer_config.json", "chat_template.jinja", "generation_config.json"} <= names
  assert sum(n.endswith(".safetensors") for n in names) > 1  # Sharded above 100 kB.
  assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"

  run = load_run(run_dir)
  tokens, mask = _tokens()
  ours = np.asarray(nnx.jit(lambda m, t, a: m(t, attention_mask=a))(
    run.model, jnp.asarray(tokens), jnp.asarray(mask)))
  reference = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
  positions = np.asarray(default_positions(jnp.asarray(mask)))
  with torch.no_grad():
    theirs = reference(input_ids=torch.tensor(tokens, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long),
                       position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()
  assert np.abs(ours - theirs)[mask].max() <= 1e-4
  # The export holds the trained parameters, not those the run started from.
  start = load_hf(standin)
  assert any(not np.allclose(a, b) for a, b in zip(
    jax.tree.leaves(nnx.state(start, nnx.Param)), jax.tree.leaves(nnx.state(run.model, nnx.Param))))

  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  for text in ("12+7=19", "What is 3 * (4 - 1)? Answer: 9"):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == run.tokenizer.encode(text)
    assert tokenizer.decode(ids) == run.tokenizer.decode(ids) == text
  generation = json.loads((out / "generation_config.json").read_text())
  source = json.loads((standin / "generation_config.json").read_text())
  assert generation["eos_token_id"] == list(run.tokenizer.end_ids) == source["eos_token_id"]
  assert generation["pad_token_id"] == run.tokenizer.pad_id
  assert (generation["temperature"], generation["top_p"]) == (0.6, 0.95)  # The source's.
  loaded = transformers.GenerationConfig.from_pretrained(out)
  assert loaded.eos_token_id == source["eos_token_id"]


def test_bfloat16_export_and_the_char_tokenizer(run_dir, tmp_path, caplog):
  report = export_run(run_dir, tmp_path / "bf16", dtype="bfloat16", max_shard_size=None)
  assert report.step == 1 and report.tokenizer_exported
  config = json.loads((tmp_path / "bf16" / "config.json").read_text())
  assert config["torch_dtype"] == "bfloat16"
  tensors = load_file(str(tmp_path / "bf16" / "model.safetensors"))
  assert all(t.dtype.name == "bfloat16" for t in tensors.values())


# A run on 8 fake CPU devices (every device on `fsdp`), then its export from the sharded
# parameters on the same mesh; the test process exports the same checkpoint on one device.
_MESH_RUN = textwrap.dedent("""
  import sys
  import jax
  from flax import nnx
  from jaxrl_post.config_args import load_module
  from jaxrl_post.methods.sft import SFT
  from jaxrl_post.parallel.mesh import make_placement
  from jaxrl_post.training import loop
  from jaxrl_post.training.export import export_run
  from jaxrl_post.training.run_dir import load_run
  workdir, out, root = sys.argv[1:4]
  config = load_module(root + "/configs/sft_arith.py").get_config("runlocal")
  config.update(dict(steps=1, checkpoint_every=1, eval_every=100, eval_examples=2,
                     eval_max_new_tokens=4, compilation_cache_dir=""))
  config.optimizer.warmup_steps = 0
  loop.train(config, workdir, SFT(config))
  placement = make_placement(config.mesh)
  leaves = jax.tree.leaves(nnx.state(load_run(workdir, mesh=placement.train_mesh).model,
                                     nnx.Param))
  assert max(len(x.sharding.device_set) for x in leaves) == 8, "not sharded"
  export_run(workdir, out, mesh=placement.train_mesh)
""")


@pytest.mark.slow  # ≈ 30 s: a run compiled for 8 devices, like tests/experiments/test_mesh_*.
def test_export_of_a_checkpoint_written_on_eight_devices(tmp_path):
  workdir, out8 = tmp_path / "run", tmp_path / "hf8"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  result = subprocess.run([sys.executable, "-c", _MESH_RUN, str(workdir), str(out8), str(ROOT)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = export_run(workdir, tmp_path / "hf1")
  assert not report.tokenizer_exported  # The char tokenizer: the model alone.
  one, eight = (load_file(str(d / "model.safetensors")) for d in (tmp_path / "hf1", out8))
  assert one.keys() == eight.keys()
  for name in one:
    np.testing.assert_array_equal(one[name], eight[name], err_msg=name)
  assert json.loads((out8 / "config.json").read_text()) == json.loads(
    (tmp_path / "hf1" / "config.json").read_text())
  generation = json.loads((tmp_path / "hf1" / "generation_config.json").read_text())
  assert set(generation) >= {"eos_token_id", "pad_token_id"}


def test_errors(run_dir, tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json not found"):
    _export(f"--run_dir={tmp_path}", f"--out={tmp_path / 'out'}")
  with pytest.raises(ValueError, match=r"step 9 has no checkpoint .*steps there: 1"):
    _export(f"--run_dir={run_dir}", f"--out={tmp_path / 'out'}", "--step=9")
  with pytest.raises(ValueError, match=r"dtype='float8'.*valid: float32, bfloat16, float16"):
    _export(f"--run_dir={run_dir}", f"--out={tmp_path / 'out'}", "--dtype=float8")
  with pytest.raises(ValueError, match="max_shard_size='5 parsecs'"):
    export_run(run_dir, tmp_path / "out", max_shard_size="5 parsecs")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="is not empty"):
    export_run(run_dir, tmp_path / "full")
  assert parse_size("5GB") == 5 * 10**9 and parse_size("1.5GiB") == 3 * 2**29
  assert parse_size(1234) == 1234
