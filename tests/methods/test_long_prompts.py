"""`methods.grpo.fitting_indices`: dataset prompts longer than `config.prompt_len` fail at
start-up (naming the example) or are skipped; generated tasks are not tokenised."""

import json

import ml_collections
import pytest

from jaxrl_post.methods.grpo import fitting_indices
from jaxrl_post.tasks import data as task_data
from jaxrl_post.tasks.base import get_task
from jaxrl_post.tokenizers import CharTokenizer


@pytest.fixture()
def task(tmp_path):
  rows = [{"question": "x" * length, "answer": "1"} for length in (3, 40, 5, 6, 50, 7)]
  path = tmp_path / "qa.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows))
  return get_task("jsonl", path={"train": str(path), "test": str(path)})


def _config(policy, prompt_len=16):
  return ml_collections.ConfigDict(dict(long_prompts=policy, prompt_len=prompt_len))


def test_error_names_the_longest_prompt(task):
  # "Q: " + 50 characters + "\n" = 54 tokens.
  with pytest.raises(ValueError, match="example 4 of split 'train' has a 54-token prompt.*"
                                       "config.prompt_len=16.*long_prompts='drop'"):
    fitting_indices(_config("error"), task, CharTokenizer(), "train", 6, "config.task")
  # The prompts a run uses fit: no error.
  assert fitting_indices(_config("error"), task, CharTokenizer(), "train", 1, "k") == [0]


def test_drop_skips_long_prompts_and_fills_the_count(task):
  keep = fitting_indices(_config("drop"), task, CharTokenizer(), "train", 3, "config.task")
  assert keep == [0, 2, 3]
  source = task_data.TaskSource(task, "train", 3, indices=keep)
  assert len(source) == 3 and [source[i]["index"] for i in range(3)] == [0, 2, 3]
  with pytest.raises(ValueError, match="only 4 of the 'train' prompts fit"):
    fitting_indices(_config("drop"), task, CharTokenizer(), "train", 5, "config.task")


def test_generated_tasks_and_bad_policy():
  arith = get_task("arith")
  assert fitting_indices(_config("error", 1), arith, CharTokenizer(), "train", 4, "k") == [
    0, 1, 2, 3]
  with pytest.raises(ValueError, match="config.long_prompts='cut'; valid: error, drop"):
    fitting_indices(_config("cut"), arith, CharTokenizer(), "train", 4, "k")
