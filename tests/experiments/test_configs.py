"""Every config builds, in every mode, with valid registry names and fitting lengths."""

from pathlib import Path

import pytest

from jaxrl_post import losses
from jaxrl_post.advantages import ADVANTAGES
from jaxrl_post.config_args import load_module
from jaxrl_post.models import get_model_config
from jaxrl_post.tasks.base import get_task
from jaxrl_post.tokenizers import get_tokenizer

_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# The LM post-training configs (SFT / GRPO) of the synthetic tasks; other experiment families
# test their own, the Hub recipes (grpo_gsm8k, grpo_math) too
# (test_qwen3_recipe_configs.py, test_gsm8k_recipe_runlocal.py): their model and data are Hub
# repositories.
_HUB_RECIPES = ("grpo_gsm8k", "grpo_math")
CONFIGS = sorted(p for p in [*_CONFIG_DIR.glob("sft_*.py"), *_CONFIG_DIR.glob("grpo_*.py")]
                 if p.stem not in _HUB_RECIPES)


def _load(path):
  return load_module(path, path.stem)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("arg", ["", "runlocal", "sft", "sft,runlocal"])
def test_config_builds_and_names_are_valid(path, arg):
  module = _load(path)
  if "sft" in arg and "grpo" not in path.stem:
    pytest.skip("only grpo_* configs have an :sft variant")
  if "sft" in arg and path.stem == "grpo_arith":
    pytest.skip("the arithmetic SFT config is its own file")
  config = module.get_config(arg)
  task = get_task(config.task, **dict(config.task_knobs))
  tokenizer = get_tokenizer(config.tokenizer)
  model = get_model_config(config.model, vocab_size=tokenizer.vocab_size)
  assert model.vocab_size >= tokenizer.vocab_size
  longest_prompt = max(len(tokenizer.encode(task.make_example("train", i)["prompt"]))
                       for i in range(200))
  assert longest_prompt <= config.prompt_len, (longest_prompt, config.prompt_len)
  if "loss" in config:
    losses.POLICY_LOSSES.get(config.loss.name)
    ADVANTAGES.get(config.advantage)
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert added and all(isinstance(kw, dict) for kw in added)
