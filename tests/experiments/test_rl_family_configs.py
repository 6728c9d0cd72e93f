"""The RL-family configs build in every variant, their tasks fit their lengths, and their
sweeps expand into runs that build."""

from pathlib import Path

import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.tasks.base import get_task
from jaxrl_post.tokenizers import get_tokenizer

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("trajval", "rapo", "headroom_drift", "cokl")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arg", ["", "runlocal", "task=arith", "task=mixture,runlocal"])
def test_config_builds_and_prompts_fit(name, arg):
  config = load_module(ROOT / "configs" / f"{name}.py").get_config(arg or None)
  task = get_task(config.task, **dict(config.task_knobs))
  tokenizer = get_tokenizer(config.tokenizer)
  longest = max(len(tokenizer.encode(task.make_example("train", i)["prompt"]))
                for i in range(100))
  assert longest <= config.prompt_len, (name, arg, longest)
  assert config.num_train_examples >= config.prompts_per_step


@pytest.mark.parametrize("name", NAMES)
def test_sweep_runs_build(name):
  module = load_module(ROOT / "configs" / f"{name}.py")
  runs = []
  module.sweep(lambda **kw: runs.append(kw))
  assert len(runs) >= 6 and {r["seed"] for r in runs} == {0, 1, 2}
  for overrides in runs:
    config = module.get_config(None)
    for key, value in overrides.items():
      *path, last = key.split(".")
      node = config
      for part in path:
        node = node[part]
      node[last] = value


def test_a_bad_task_or_variant_names_the_argument():
  with pytest.raises(ValueError, match="task='gsm8k'"):
    load_module(ROOT / "configs" / "cokl.py").get_config("task=gsm8k")
  with pytest.raises(ValueError, match="kl='forward'"):
    load_module(ROOT / "configs" / "cokl.py").get_config("kl=forward")
  with pytest.raises(ValueError, match="replay='fifo'"):
    load_module(ROOT / "configs" / "headroom_drift.py").get_config("replay=fifo")
