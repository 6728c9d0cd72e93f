"""GSM8K, MATH and MATH-500 tasks on tiny fixtures with the real column names: records, rewards,
the tfds / grain data path, the Hub cache offline, and errors for bad files and names."""

import json

import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds

from jaxrl_post import standin
from jaxrl_post.tasks import data as task_data
from jaxrl_post.tasks import get_task, math_datasets, parse_meta

INSTRUCTION = math_datasets.DEFAULT_INSTRUCTION

# openai/gsm8k (config "main"): question, answer = worked solution ending in "#### <number>".
GSM8K_ROWS = [
  {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
               "many clips in May. How many clips did Natalia sell altogether in April and May?",
   "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
             "<<48+24=72>>72 clips altogether in April and May.\n#### 72"},
  {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
               "babysitting. How much did she earn?",
   "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned "
             "0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"},
  {"question": "A shop sold 1,200 pens at $1 each and refunded 25. Net revenue?",
   "answer": "1200 - 25 = <<1200-25=1175>>1175\n#### 1,175"},
  {"question": "The temperature was 3 degrees and fell by 8. What is it now?",
   "answer": "3 - 8 = <<3-8=-5>>-5\n#### -5"},
]
# DigitalLearningGmbH/MATH-lighteval: problem, level, solution, type; gold = last \boxed{}.
MATH_ROWS = [
  {"problem": "Simplify $\\frac{2}{4}$.", "level": "Level 1", "type": "Prealgebra",
   "solution": "Divide by 2: $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$."},
  {"problem": "Solve $x^2 = 4$ for $x > 0$.", "level": "Level 2", "type": "Algebra",
   "solution": "Try $\\boxed{3}$? No: $x = \\boxed{2}$."},
  {"problem": "A problem whose solution lost its box.", "level": "Level 3", "type": "Geometry",
   "solution": "The answer is 7."},
  {"problem": "For which $x$ is $1 < x \\le 2$?", "level": "Level 4",
   "type": "Intermediate Algebra", "solution": "So $x \\in \\boxed{(1,2]}$."},
]
# HuggingFaceH4/MATH-500 test.jsonl: problem, solution, answer, subject, level, unique_id.
MATH500_ROWS = [
  {"problem": "Evaluate $\\sqrt{2}/2$ as a fraction.", "solution": "It is "
   "$\\boxed{\\frac{\\sqrt{2}}{2}}$.", "answer": "\\frac{\\sqrt2}{2}", "subject": "Algebra",
   "level": 2, "unique_id": "test/algebra/1.json"},
  {"problem": "How long is the rod?", "solution": "It is $\\boxed{10\\text{ cm}}$.",
   "answer": "10\\text{ cm}", "subject": "Geometry", "level": 1,
   "unique_id": "test/geometry/2.json"},
]


def _write_parquet(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), str(path))
  return str(path)


def _write_jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("math_data")
  return {
    "gsm8k": {"train": _write_parquet(root / "gsm8k" / "train.parquet", GSM8K_ROWS),
              "test": _write_parquet(root / "gsm8k" / "test.parquet", GSM8K_ROWS[:2])},
    "math": {"train": _write_parquet(root / "math" / "train.parquet", MATH_ROWS),
             "test": _write_parquet(root / "math" / "test.parquet", MATH_ROWS[:2])},
    "math500": _write_jsonl(root / "math500" / "test.jsonl", MATH500_ROWS),
  }


def test_gsm8k_records(files):
  task = get_task("gsm8k", path=files["gsm8k"])
  assert task.splits == ["test", "train"]
  assert task.num_examples("train") == 4 and task.num_examples("test") == 2
  record = task.make_example("train", 0)
  assert record["prompt"] == GSM8K_ROWS[0]["question"] + "\n" + INSTRUCTION + "\n"
  assert record["answer"] == "72"
  # Calculator annotations go; the demonstration ends in the boxed answer the prompt asks for.
  assert record["demonstration"] == (
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April "
    "and May.\nThe final answer is $\\boxed{72}$.")
  assert [task.make_example("train", i)["answer"] for i in range(4)] == ["72", "10", "1,175", "-5"]
  bare = get_task("gsm8k", path=files["gsm8k"], instruction="")
  assert bare.make_example("train", 0)["prompt"] == GSM8K_ROWS[0]["question"] + "\n"


def test_math_records_take_the_last_box_and_drop_rows_without_one(files):
  task = get_task("math", path=files["math"])
  assert task.num_examples("train") == 3 and task.dropped_rows == {"test": 0, "train": 1}
  answers = [task.make_example("train", i)["answer"] for i in range(3)]
  assert answers == ["\\frac{1}{2}", "2", "(1,2]"]
  record = task.make_example("train", 1)
  assert record["demonstration"] == MATH_ROWS[1]["solution"]
  assert parse_meta(record) == {"level": "Level 2", "type": "Algebra"}
  assert record["prompt"].endswith("for $x > 0$.\n" + INSTRUCTION + "\n")


def test_math500_records(files):
  task = get_task("math500", path=files["math500"])  # one file: the single split "test"
  assert task.splits == ["test"]
  record = task.make_example("test", 1)
  assert record["answer"] == "10\\text{ cm}"
  assert parse_meta(record) == {"level": 1, "subject": "Geometry",
                                "unique_id": "test/geometry/2.json"}


@pytest.mark.parametrize("name", ["gsm8k", "math", "math500"])
def test_demonstrations_earn_full_reward(files, name):
  task = get_task(name, path=files[name])
  for split in task.splits:
    for i in range(task.num_examples(split)):
      record = task.make_example(split, i)
      assert task.reward(record, record["demonstration"]) == (1.0, 1.0), (split, i)
      assert task.reward(record, "I do not know.") == (0.0, 0.0)


def test_rewards_route_math_to_the_pool_and_gsm8k_in_process(files):
  from jaxrl_post.rewards import verifiers

  gsm8k = get_task("gsm8k", path=files["gsm8k"])
  assert verifiers.pooled_verifier(gsm8k) is None
  math500 = get_task("math500", path=files["math500"])
  assert verifiers.pooled_verifier(math500) is not None
  records = [math500.make_example("test", 0), math500.make_example("test", 1)]
  texts = ["\\boxed{\\frac{1}{\\sqrt{2}}}", "\\boxed{1", "\\boxed{10}", "10 cm"]
  correct, fmt, failures = verifiers.rewards_for(math500, records, texts, 2, timeout_s=10.0)
  np.testing.assert_array_equal(correct, [1.0, 0.0, 1.0, 0.0])
  np.testing.assert_array_equal(fmt, [1.0, 0.0, 1.0, 0.0])
  assert failures.total == 0


def test_gsm8k_through_tfds_and_grain_with_resume(files, tmp_path):
  tfds.disable_progress_bar()
  task = get_task("gsm8k", path=files["gsm8k"])
  builder = task_data.prepare_task_dataset(task, str(tmp_path))
  assert builder.info.splits["train"].num_examples == 4
  assert builder.info.metadata["fingerprint"]["sources"]["train"]["sha256"]
  read = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
  source = builder.as_data_source("train")

  def loader(shard, **kwargs):
    return task_data.make_loader(source, batch_size=2, seed=3, shard_index=shard, shard_count=2,
                                 read_options=read, **kwargs)

  # The two process shards partition the split (tfds stores records in its own order).
  epoch = [next(iter(loader(shard, num_epochs=1))) for shard in (0, 1)]
  indices = np.concatenate([batch["index"] for batch in epoch])
  assert sorted(indices.tolist()) == [0, 1, 2, 3]
  answers = {i: a for b in epoch for i, a in zip(b["index"].tolist(), b["answer"].tolist())}
  assert answers == {0: "72", 1: "10", 2: "1,175", 3: "-5"}
  # Exact resume from the iterator's state.
  iterator = iter(loader(1))
  next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(3)]
  resumed = iter(loader(1))
  resumed.set_state(state)
  for batch in expected:
    np.testing.assert_array_equal(next(resumed)["index"], batch["index"])


def test_fingerprint_follows_file_content_not_cache_or_time_limit(files, tmp_path):
  path = _write_jsonl(tmp_path / "m500.jsonl", MATH500_ROWS)
  before = get_task("math500", path=path).fingerprint()
  assert before == get_task("math500", path=path, verify_timeout_s=1).fingerprint()
  _write_jsonl(tmp_path / "m500.jsonl", MATH500_ROWS[:1])
  after = get_task("math500", path=path).fingerprint()
  assert before["sources"]["test"]["path"] == after["sources"]["test"]["path"] == path
  assert before["sources"]["test"]["sha256"] != after["sources"]["test"]["sha256"]


def test_bad_files_and_names_say_what_was_expected(files, tmp_path):
  no_answer = _write_parquet(tmp_path / "bad.parquet", [{"question": "q", "solution": "s"}])
  with pytest.raises(ValueError, match=r"bad.parquet: missing column 'answer'; columns "
                                       r"present: \['question', 'solution'\]"):
    get_task("gsm8k", path={"train": no_answer})
  rows = [dict(MATH500_ROWS[0]), {k: v for k, v in MATH500_ROWS[1].items() if k != "unique_id"}]
  no_id = _write_jsonl(tmp_path / "bad.jsonl", rows)
  with pytest.raises(ValueError, match=r"bad.jsonl line 2: missing field 'unique_id'"):
    get_task("math500", path=no_id)
  with pytest.raises(KeyError, match=r"unknown task 'gsm9k'; valid names: .*gsm8k.*math500"):
    get_task("gsm9k")
  with pytest.raises(TypeError, match=r"task 'math' has no knob\(s\) \['instructions'\]"):
    get_task("math", path=files["math"], instructions="")
  with pytest.raises(ValueError, match=r"unknown split\(s\) \['validation'\]; expected train, "
                                       r"test"):
    get_task("gsm8k", path={"validation": files["gsm8k"]["test"]})
  with pytest.raises(ValueError, match=r"path must map splits \(train, test\) to files"):
    get_task("math", path=files["math"]["train"])
  with pytest.raises(ValueError, match=r"unknown file type '.csv'; expected one of .json, "):
    get_task("math500", path=str(tmp_path / "test.csv"))
  with pytest.raises(FileNotFoundError, match=r"jsonl file not found: .*nope.jsonl"):
    get_task("math500", path=str(tmp_path / "nope.jsonl"))
  task = get_task("math500", path=files["math500"])
  with pytest.raises(ValueError, match=r"unknown split 'train'; task 'math500' has test"):
    task.make_example("train", 0)


def test_hub_files_load_offline_from_the_cache(tmp_path, monkeypatch):
  # A dataset repository laid out as on the Hub, staged into huggingface_hub's cache.
  repo = tmp_path / "repo"
  _write_parquet(repo / math_datasets.GSM8K_FILES["train"], GSM8K_ROWS)
  _write_parquet(repo / math_datasets.GSM8K_FILES["test"], GSM8K_ROWS[:2])
  cache = tmp_path / "hub_cache"
  standin.stage_in_hub_cache(repo, "openai/gsm8k", cache_dir=cache, repo_type="dataset")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")

  task = get_task("gsm8k", cache_dir=str(cache))
  assert task.num_examples("train") == 4 and task.make_example("test", 1)["answer"] == "10"
  source = task.fingerprint()["sources"]["train"]
  assert source["repo_id"] == "openai/gsm8k" and source["revision"] == "main"
  assert source["filename"] == "main/train-00000-of-00001.parquet" and len(source["sha256"]) == 64
  # HF_HUB_CACHE is honoured when the knob is not given.
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))
  assert get_task("gsm8k").fingerprint() == task.fingerprint()
  # A dataset that is not cached fails offline, naming it and the way out.
  with pytest.raises(FileNotFoundError, match=r"'test.jsonl' of the Hub dataset "
                                              r"'HuggingFaceH4/MATH-500'.*HF_HUB_OFFLINE.*path"):
    get_task("math500")
