"""experiments/grpo.py and sft.py on device meshes from config: the same runs as on one device.

Each run is a `runlocal` config in a subprocess on a fake 8-device CPU host,
with a different `config.mesh`; its per-step metrics must equal those of the
1-device run (XLA_FLAGS=""). On 2 loaded cores the GRPO tests take 75-85 s (four
runs of 13-23 s, mostly compilation) and the SFT pair 30-40 s, hence `slow`.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jaxrl_post import tokenizers
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import save_hf
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ONE_DEVICE = dict(os.environ, XLA_FLAGS="")
EIGHT_DEVICES = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
COMPARED = ("train/loss", "train/grad_norm", "train/reward_correct", "train/reward_format")
# Short: 3 steps, the evaluations and checkpoints the binary must do anyway (at
# steps 0 and 3) and none in between.
ARGS = ("--config.steps=3", "--config.eval_every=100", "--config.checkpoint_every=100",
        "--config.eval_pass_k=0", "--config.eval_examples=2")


def _format_writer(path: Path) -> Path:
  """A `tiny` policy that writes `#### <digits>` with a random number of `#`s, as HF weights.

  A scratch policy never earns the arithmetic task's format reward, so every
  advantage, loss and gradient of a scratch run is 0, and comparing meshes
  would compare zeros. This one is nearly a bigram model: the layers' output
  projections are scaled down, so the last hidden state is the current
  token's embedding, a one-hot "state", which `lm_head` maps to next-token
  log-probs: prompt end → `#`; `#` → `#` (3/4) or ` ` (1/4); ` ` → a digit;
  digit → a digit or EOS (1/2 each). About one completion in ten has exactly
  four `#`s (format reward 1), so some groups have non-zero advantages, and
  the layers' small random weights still take part in every gradient.
  """
  tokenizer = tokenizers.get_tokenizer("char")
  digits = tokenizer.encode("0123456789")
  hash_, space, eos = tokenizer.token_to_id("#"), tokenizer.token_to_id(" "), tokenizer.eos_id
  state_of = {hash_: 1, space: 2, **{d: 3 for d in digits}}  # Everything else: state 0.
  nexts = [{hash_: 1.0}, {hash_: 0.75, space: 0.25}, {d: 0.1 for d in digits},
           {eos: 0.5, **{d: 0.05 for d in digits}}]
  config = get_model_config("tiny", vocab_size=tokenizer.vocab_size)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  d = config.embed_dim
  embed = np.zeros((config.vocab_size, d), np.float32)
  embed[np.arange(config.vocab_size), [state_of.get(t, 0) for t in range(config.vocab_size)]] = (
    np.sqrt(d))  # RMS 1: the final norm leaves it as is.
  lm_head = np.zeros((d, config.vocab_size), np.float32)
  for state, probs in enumerate(nexts):
    logp = np.full(config.vocab_size, np.log(1e-6), np.float32)
    logp[list(probs)] = np.log(list(probs.values()))
    lm_head[state] = logp / np.sqrt(d)
  model.embed.set_value(embed)
  model.lm_head.set_value(lm_head)
  for layer in model.layers:
    layer.attn.o_proj.set_value(0.02 * layer.attn.o_proj.get_value())
    layer.mlp.down_proj.set_value(0.02 * layer.mlp.down_proj.get_value())
  save_hf(model, path)
  return path


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  return _format_writer(tmp_path_factory.mktemp("format_writer"))


def _grpo(workdir, env, *extra):
  command = [sys.executable, str(ROOT / "experiments" / "grpo.py"),
             f"--config={ROOT / 'configs' / 'grpo_arith.py'}:runlocal", f"--workdir={workdir}",
             *ARGS, *extra]
  return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                        check=False)


def _train_records(workdir, policy, env, *extra):
  """The run's per-step training records and its log (stderr)."""
  result = _grpo(workdir, env, f"--config.init_from={policy}", *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  return [r for r in read_metrics(workdir) if "train/loss" in r], result.stderr


@pytest.fixture(scope="module")
def one_device(policy, tmp_path_factory):
  records, _ = _train_records(tmp_path_factory.mktemp("one_device"), policy, ONE_DEVICE)
  assert [r["step"] for r in records] == [1, 2, 3]
  # The comparison below is not one of zeros.
  assert max(r["train/grad_norm"] for r in records) > 1e-2
  assert max(abs(r["train/loss"]) for r in records) > 1e-3
  return records


@pytest.mark.slow
@pytest.mark.parametrize("mesh, logged", [
  ((), "trainer mesh {'data': 1, 'fsdp': 8, 'tensor': 1}, sampler mesh {'data': 1, 'fsdp': 8, "
       "'tensor': 1} (colocated)"),
  (("--config.mesh.ici_data=2", "--config.mesh.ici_fsdp=2", "--config.mesh.ici_tensor=2"),
   "trainer mesh {'data': 2, 'fsdp': 2, 'tensor': 2}, sampler mesh {'data': 2, 'fsdp': 2, "
   "'tensor': 2} (colocated)"),
  (("--config.mesh.sampler_devices=4",),
   "trainer mesh {'data': 1, 'fsdp': 4, 'tensor': 1}, sampler mesh {'data': 4, 'fsdp': 1, "
   "'tensor': 1} (disaggregated)"),
], ids=["fsdp8", "data2_fsdp2_tensor2", "disaggregated"])
def test_grpo_on_a_mesh_matches_one_device(mesh, logged, policy, one_device, tmp_path):
  records, log = _train_records(tmp_path, policy, EIGHT_DEVICES, *mesh)
  assert logged in log
  assert [r["step"] for r in records] == [1, 2, 3]
  for single, sharded in zip(one_device, records):
    assert sharded["time/reshard"] >= 0.0
    for key in COMPARED:
      # The same tokens are sampled, so the rewards are equal exactly. Loss and
      # gradient norm differ only by float32 summation order across shards
      # (carried through 3 Adam steps): measured ≤ 1.1e-6 relative (~10 ulp) on
      # every mesh here. 1e-4 leaves 100× room, far below what a wrong
      # normaliser (per-shard token counts) or a lost shard of rows would move.
      np.testing.assert_allclose(sharded[key], single[key], rtol=1e-4, atol=1e-6,
                                 err_msg=f"{key} at step {single['step']}")


def test_a_mesh_that_does_not_fit_fails_naming_the_key(tmp_path):
  result = _grpo(tmp_path, EIGHT_DEVICES, "--config.mesh.ici_fsdp=3")
  assert result.returncode != 0
  assert "config.mesh.ici_fsdp=3" in result.stderr


@pytest.mark.slow
def test_sft_on_a_mesh_matches_one_device(tmp_path):
  def run(workdir, env, *extra):
    command = [sys.executable, str(ROOT / "experiments" / "sft.py"),
               f"--config={ROOT / 'configs' / 'sft_arith.py'}:runlocal", f"--workdir={workdir}",
               "--config.steps=3", *extra]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return [r for r in read_metrics(workdir) if "train/nll" in r]

  single = run(tmp_path / "one", ONE_DEVICE)
  sharded = run(tmp_path / "eight", EIGHT_DEVICES, "--config.mesh.ici_data=2",
                "--config.mesh.ici_fsdp=2", "--config.mesh.ici_tensor=2")
  assert [r["step"] for r in sharded] == [r["step"] for r in single] == [1, 2, 3]
  for a, b in zip(single, sharded):
    for key in ("train/nll", "train/grad_norm"):  # Tolerance: as for GRPO above.
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)
