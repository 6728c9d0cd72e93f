"""GRPO with LoRA (runlocal): adapters train on a frozen base, checkpoints hold the adapters
only, a restart continues exactly, with β > 0 the reference is the base model itself, and the
run exports merged weights that `transformers` loads."""

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from flax import nnx
from runlocal_helpers import train_records

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.models import without_lora
from jaxrl_post.models.lora import merge_adapters
from jaxrl_post.sampling import Sampler
from jaxrl_post.training import loop
from jaxrl_post.training.export import export_run

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("train/loss", "train/grad_norm", "train/reward_format", "rollout/logp_abs_diff_max")


def _config(init):
  config = load_module(ROOT / "configs" / "grpo_arith.py").get_config("runlocal")
  config.unlock()
  config.update(dict(init_from=str(init), steps=2, checkpoint_every=1, prompts_per_step=4,
                     log_every=1, eval_every=100, eval_at_start=False, metric_writers="jsonl"))
  config.lora.update(dict(rank=4, alpha=8.0))
  config.loss.beta = 0.05
  config.optimizer.lr = 1e-2  # adapters start at b = 0: a visible move in two steps
  return config


def _saved_paths(step_dir: Path) -> list[str]:
  metadata = ocp.StandardCheckpointer().metadata(step_dir / "state").item_metadata
  return [jax.tree_util.keystr(path) for path, _ in
          jax.tree_util.tree_flatten_with_path(metadata.tree)[0]]


@pytest.mark.slow  # two short GRPO runs (≈ 35 s on 2 busy cores)
def test_lora_grpo_trains_resumes_references_the_base_and_exports_merged(
    tmp_path, format_writer_policy):
  config = _config(format_writer_policy)
  method = GRPO(config)
  state = loop.train(config, tmp_path / "full", method)
  full = train_records(tmp_path / "full")
  assert [r["step"] for r in full] == [1, 2]
  assert max(r["train/grad_norm"] for r in full) > 1e-3  # a real signal
  # Sampler (merged kernels, base graph) and trainer (unmerged) agree to float rounding.
  assert all(r["rollout/logp_abs_diff_max"] < 1e-4 for r in full)
  assert any(np.any(np.asarray(x)) for path, x in jax.tree_util.tree_flatten_with_path(
    state.params)[0] if "_lora_b" in jax.tree_util.keystr(path))

  # Checkpoints: the adapters and their optimizer state, not one base parameter.
  paths = _saved_paths(tmp_path / "full" / "checkpoints" / "2")
  params = [p for p in paths if p.startswith(("['params']", "['opt_state']")) and
            "['value']" in p]
  assert params and all("_lora_" in p for p in params), params

  # A restart from checkpoint 1 (the later one removed) continues exactly.
  resumed = tmp_path / "resumed"
  shutil.copytree(tmp_path / "full", resumed)
  shutil.rmtree(resumed / "checkpoints" / "2")
  again = loop.train(config, resumed, GRPO(config))
  for a, b in zip(full, train_records(resumed), strict=True):
    assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(x, y)

  # β > 0: the reference is the starting adapters (b = 0) on the frozen base, i.e. the base
  # model: its log-probs equal the base graph's on the base parameters.
  frozen = method.run.frozen
  assert not any(np.any(np.asarray(x)) for path, x in jax.tree_util.tree_flatten_with_path(
    method.reference)[0] if "_lora_b" in jax.tree_util.keystr(path))
  tokens = dict(prompt_tokens=jnp.full((2, 4), 5, jnp.int32), prompt_mask=jnp.ones((2, 4), bool),
                completion_tokens=jnp.arange(10, dtype=jnp.int32).reshape(2, 5) + 3,
                completion_mask=jnp.ones((2, 5), bool))
  reference = method.scorer.score(nnx.merge_state(method.reference, frozen), **tokens).logp
  base = Sampler(without_lora(method.model), max_prompt_len=16).score(frozen, **tokens).logp
  np.testing.assert_allclose(reference, base, atol=1e-6)

  # Merge-and-export: a plain model of the base architecture whose logits are ours.
  report = export_run(tmp_path / "full", tmp_path / "hf")
  assert report.step == 2 and "model.safetensors" in report.files
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "hf", torch_dtype=torch.float32).eval()
  ids = np.arange(12).reshape(2, 6) + 3
  with torch.no_grad():
    theirs = torch_model(torch.as_tensor(ids)).logits.numpy()
  merged_model = without_lora(method.model)
  nnx.update(merged_model, merge_adapters(state.params, frozen))
  np.testing.assert_allclose(merged_model(jnp.asarray(ids, jnp.int32)), theirs, atol=1e-5)

  # A LoRA run's checkpoint cannot be another LoRA run's base: it holds adapters only.
  child = _config(tmp_path / "full")
  with pytest.raises(ValueError, match=r"config.init_from=.*lacks \(missing \['embed'\]"):
    loop.train(child, tmp_path / "child", GRPO(child))
