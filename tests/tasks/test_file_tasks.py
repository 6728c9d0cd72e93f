"""GSM8K-style JSONL and parquet files: records, rewards, and the errors for bad files."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrl_post.tasks import get_task

ROWS = [
  {
    "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many?",
    "answer": "In May: 48/2 = <<48/2=24>>24 clips.\nIn all: 48+24 = <<48+24=72>>72.\n#### 72",
  },
  {"question": "What is 1000 + 234?", "answer": "#### 1,234"},
  {"question": "Name the capital of France.", "answer": "Paris"},
]


def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return path


def write_parquet(path, rows):
  pq.write_table(pa.Table.from_pylist(rows), path)
  return path


@pytest.fixture(params=["jsonl", "parquet"])
def qa_task(request, tmp_path):
  write = write_jsonl if request.param == "jsonl" else write_parquet
  path = write(tmp_path / f"train.{request.param}", ROWS)
  return get_task(request.param, path=str(path))


def test_records_from_a_file(qa_task):
  assert qa_task.splits == ["train"] and qa_task.num_examples("train") == 3
  first, second, third = (qa_task.make_example("train", i) for i in range(3))
  assert first["prompt"] == f"Q: {ROWS[0]['question']}\n"
  assert first["answer"] == "72"
  assert first["demonstration"] == ROWS[0]["answer"]  # GSM8K's solution, as is.
  assert second["answer"] == "1,234" and second["demonstration"] == "#### 1,234"
  assert third["answer"] == "Paris" and third["demonstration"] == "#### Paris"
  assert json.loads(first["meta"])["source"].startswith("train.")
  for record in (first, second, third):
    assert qa_task.reward(record, record["demonstration"]) == (1.0, 1.0)


def test_numeric_and_text_answers(qa_task):
  gsm, number, word = (qa_task.make_example("train", i) for i in range(3))
  assert qa_task.reward(gsm, "72 clips\n#### 72") == (1.0, 1.0)
  assert qa_task.reward(gsm, "#### 72.00") == (1.0, 1.0)
  assert qa_task.reward(gsm, "#### $72") == (1.0, 1.0)
  assert qa_task.reward(gsm, "#### 73") == (0.0, 1.0)
  assert qa_task.reward(gsm, "#### seventy-two") == (0.0, 1.0)
  assert qa_task.reward(gsm, "72") == (0.0, 0.0)
  assert qa_task.reward(number, "#### 1234") == (1.0, 1.0)
  assert qa_task.reward(word, "####   paris ") == (1.0, 1.0)
  assert qa_task.reward(word, "#### Lyon") == (0.0, 1.0)
  assert qa_task.reward(gsm, "#### ½") == (0.0, 1.0)  # Any answer text is well-formed here.
  for garbage in ("", "#### " + "9" * 50_000, None, "####\n#### 72"):
    assert qa_task.reward(gsm, garbage) == (0.0, 0.0)


def test_splits_from_a_mapping_and_custom_fields(tmp_path):
  rows = [{"q": f"question {i}", "a": i} for i in range(4)]  # Numeric answers are accepted.
  task = get_task(
    "jsonl",
    path={"train": write_jsonl(tmp_path / "a.jsonl", rows[:3]),
          "test": write_jsonl(tmp_path / "b.jsonl", rows[3:])},
    question_field="q",
    answer_field="a",
    prompt_template="Problem: {question}\nSolution:\n",
  )
  assert task.splits == ["test", "train"]
  record = task.make_example("test", 0)
  assert record["prompt"] == "Problem: question 3\nSolution:\n" and record["answer"] == "3"
  with pytest.raises(ValueError, match="unknown split 'validation'; this task has test, train"):
    task.make_example("validation", 0)
  with pytest.raises(IndexError, match=r"example 3 of split 'train' is out of range \[0, 3\)"):
    task.make_example("train", 3)


def test_fingerprint_follows_the_file_content(tmp_path):
  path = write_jsonl(tmp_path / "d.jsonl", ROWS)
  before = get_task("jsonl", path=str(path)).fingerprint()
  write_jsonl(path, ROWS[:2])
  after = get_task("jsonl", path=str(path)).fingerprint()
  assert before["path"] == after["path"] and before["file_sha256"] != after["file_sha256"]


def test_missing_file(tmp_path):
  missing = tmp_path / "nope.jsonl"
  with pytest.raises(FileNotFoundError, match=r"jsonl file for split 'train' not found: .*nope"):
    get_task("jsonl", path=str(missing))
  with pytest.raises(FileNotFoundError, match="split 'test'"):
    get_task("parquet", path={"test": str(tmp_path / "nope.parquet")})


def test_missing_field_names_field_and_line(tmp_path):
  path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], {"question": "q", "solution": "1"}])
  with pytest.raises(ValueError, match=r"bad.jsonl line 2: missing field 'answer'; fields "
                                       r"present: \['question', 'solution'\]"):
    get_task("jsonl", path=str(path))
  with pytest.raises(ValueError, match="missing field 'prompt'"):
    get_task("jsonl", path=str(write_jsonl(tmp_path / "ok.jsonl", ROWS)), question_field="prompt")


def test_missing_parquet_column(tmp_path):
  path = write_parquet(tmp_path / "bad.parquet", [{"question": "q", "label": "1"}])
  with pytest.raises(ValueError, match=r"bad.parquet: missing column 'answer'; columns "
                                       r"present: \['label', 'question'\]"):
    get_task("parquet", path=str(path))


@pytest.mark.parametrize(
  "content, match",
  [
    ('{"question": "q", "answer": "1"}\n{not json}\n', "line 2: not valid JSON"),
    ('["q", "1"]\n', "line 1: expected an object"),
    ('{"question": 5, "answer": "1"}\n', "'question' must be a string"),
    ('{"question": "q", "answer": null}\n', "'answer' must be a string or a number"),
  ],
)
def test_malformed_jsonl(tmp_path, content, match):
  path = tmp_path / "bad.jsonl"
  path.write_text(content, encoding="utf-8")
  with pytest.raises(ValueError, match=match):
    get_task("jsonl", path=str(path))


def test_blank_lines_are_skipped_and_template_is_checked(tmp_path):
  path = tmp_path / "gaps.jsonl"
  path.write_text("\n" + json.dumps(ROWS[1]) + "\n\n", encoding="utf-8")
  assert get_task("jsonl", path=str(path)).num_examples("train") == 1
  with pytest.raises(ValueError, match="prompt_template must contain"):
    get_task("jsonl", path=str(path), prompt_template="Q: ")
