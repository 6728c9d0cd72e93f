"""experiments/evaluate.py on a run's checkpoint: the numbers the run logged at that step."""

import json
from pathlib import Path

import numpy as np
import pytest
from absl import app

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.methods.sft import SFT
from jaxrl_post.standin import write_standin_checkpoint
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_eval_outcomes, read_metrics

ROOT = Path(__file__).resolve().parents[2]
BINARY = load_module(ROOT / "experiments" / "evaluate.py", "evaluate_binary")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, format_writer_policy):
  """One SFT step of the format writer (conftest.py: its completions earn format rewards, so
  the compared numbers are not all zeros), evaluated in-run with n = 8 samples per prompt.

  Its greedy completions are all `#`s (no format reward); about one sample in ten has exactly
  four, so `sample_format` is not 0."""
  workdir = tmp_path_factory.mktemp("sft_run")
  config = load_module(ROOT / "configs" / "sft_arith.py").get_config("runlocal")
  config.update(dict(steps=1, checkpoint_every=1, eval_every=1, eval_examples=4, eval_pass_k=8,
                     init_from=str(format_writer_policy), compilation_cache_dir=""))
  loop.train(config, workdir, SFT(config))
  return workdir


def _evaluate(*flags):
  BINARY.main(script_flags.parse(BINARY.FLAGS, ["evaluate.py", *flags]))


def test_offline_evaluation_equals_the_in_run_one(run_dir, tmp_path, capsys):
  out = tmp_path / "report.json"
  _evaluate(f"--run_dir={run_dir}", f"--output={out}")
  report = json.loads(out.read_text())
  assert set(report) == {"metrics", "settings", "problems"}
  settings = report["settings"]
  assert settings["step"] == 1 and settings["task"] == "arith" and settings["n"] == 8
  assert settings["pass_ks"] == [1, 2, 4, 8] and settings["num_examples"] == 4
  metrics = report["metrics"]
  for key in ("accuracy", "accuracy_se", "format", "sample_accuracy", "sample_accuracy_se",
              "pass_at_1", "pass_at_1_se", "pass_at_8", "pass_at_8_se", "sample_format",
              "verifier_errors",
              "verifier_timeouts", "num_problems"):
    assert key in metrics, key
  logged = next(r for r in read_metrics(run_dir) if r["step"] == 1 and "eval/accuracy" in r)
  # The same function, prompts, parameters and draws: the same numbers, exactly.
  for key in ("accuracy", "format", "sample_accuracy", "sample_format", "pass_at_8",
              "accuracy_se", "sample_accuracy_se", "pass_at_8_se"):
    assert metrics[key] == logged[f"eval/{key}"], key
  assert metrics["sample_format"] > 0  # The format writer's samples: not zeros compared.
  outcomes = read_eval_outcomes(run_dir)[1]
  problems = report["problems"]
  assert [p["greedy_correct"] for p in problems] == outcomes["greedy_correct"].tolist()
  np.testing.assert_array_equal([p["sample_correct"] for p in problems],
                                outcomes["sample_correct"])
  assert all(p["prompt"] and isinstance(p["greedy_completion"], str) for p in problems)
  table = capsys.readouterr().out
  assert "greedy accuracy" in table and "mean@8" in table and "pass@8" in table


def test_settings_flags_and_the_default_output(run_dir, format_writer_policy, tmp_path):
  _evaluate(f"--run_dir={run_dir}", "--n=4", "--k=1,3", "--num_examples=3", "--temperature=0.5")
  report = json.loads((run_dir / "evaluations" / "step_00000001_arith_test.json").read_text())
  assert report["settings"]["pass_ks"] == [1, 3] and len(report["problems"]) == 3
  assert report["settings"]["temperature"] == 0.5
  assert "pass_at_3_se" in report["metrics"] and "pass_at_2" not in report["metrics"]
  assert all(len(p["sample_correct"]) == 4 for p in report["problems"])
  # A Hugging Face checkpoint: no run, so the task is named.
  out = tmp_path / "hf.json"
  _evaluate(f"--init_from={format_writer_policy}", "--tokenizer=char", "--task=arith",
            "--n=0", "--num_examples=2", "--max_new_tokens=8", f"--output={out}")
  report = json.loads(out.read_text())
  assert report["settings"]["step"] is None and set(report["metrics"]) >= {"accuracy", "format"}


def test_usage_errors(run_dir, format_writer_policy):
  with pytest.raises(app.UsageError, match="exactly one of --run_dir"):
    _evaluate()
  with pytest.raises(app.UsageError, match="exactly one of --run_dir"):
    _evaluate(f"--run_dir={run_dir}", f"--init_from={format_writer_policy}")
  with pytest.raises(app.UsageError, match=r"1 <= k <= n \(--n=2\)"):
    _evaluate(f"--run_dir={run_dir}", "--n=2", "--k=4")
  with pytest.raises(ValueError, match=r"step 5 has no checkpoint .*steps there: 1"):
    _evaluate(f"--run_dir={run_dir}", "--step=5")
  with pytest.raises(app.UsageError, match="has no task"):
    _evaluate(f"--init_from={format_writer_policy}", "--tokenizer=char")


def test_chat_template_renders_the_prompts(tmp_path):
  checkpoint = write_standin_checkpoint(tmp_path / "qwen3")
  out = tmp_path / "chat.json"
  _evaluate(f"--init_from={checkpoint}", "--task=arith", "--chat_template", "--n=0",
            "--num_examples=1", "--max_new_tokens=4", f"--output={out}")
  report = json.loads(out.read_text())
  assert report["settings"]["chat_template"] is True
  # Thinking off by default (the configs' chat_template_kwargs): an empty <think> block.
  assert report["problems"][0]["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
  assert report["settings"]["chat_template_kwargs"] == {"enable_thinking": False}
