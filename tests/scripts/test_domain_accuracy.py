"""scripts/domain_accuracy.py: per-domain accuracy of a mixture grid from per-prompt outcomes."""

import json
from pathlib import Path

import numpy as np
import pytest

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.training.metrics import write_eval_outcomes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = load_module(ROOT / "scripts" / "domain_accuracy.py")


def _run(workdir: Path, config, first, last):
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps(config.to_dict(), default=str))
  write_eval_outcomes(workdir, 0, greedy_correct=np.asarray(first, np.float32))
  write_eval_outcomes(workdir, 4, greedy_correct=np.asarray(last, np.float32))
  (workdir / "DONE").write_text("60")


def test_per_domain_accuracy_from_the_runs_own_prompts(tmp_path):
  config = load_module(ROOT / "configs" / "cd_rft.py").get_config("runlocal")
  config.eval_examples = 12
  _run(tmp_path / "probe", config, np.zeros(12), np.zeros(12))
  domains = SCRIPT.prompt_domains(tmp_path / "probe")
  assert len(domains) == 12 and set(domains) == {"arith1", "arith3"}
  one = (domains == "arith1").astype(np.float32)
  # Row "a": arith1 goes 0 → 1, arith3 stays 0; row "b" (2 seeds): everything correct.
  _run(tmp_path / "runs" / "a" / "seed0", config, np.zeros(12), one)
  _run(tmp_path / "runs" / "b" / "seed0", config, np.ones(12), np.ones(12))
  _run(tmp_path / "runs" / "b" / "seed1", config, np.ones(12), one)
  out = tmp_path / "domains.md"
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["x", f"--root={tmp_path}", f"--out={out}"]))
  lines = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
           for line in out.read_text().splitlines() if line.startswith("| a ")
           or line.startswith("| b ")}
  assert lines["a"][1:] == ["1", "0.000 → 1.000", "+100.0", "0.000 → 0.000", "+0.0"]
  assert lines["b"][1:] == ["2", "1.000 ± 0.000 → 1.000 ± 0.000", "+0.0 ± 0.0",
                            "1.000 ± 0.000 → 0.500 ± 0.707", "-50.0 ± 70.7"]
  # A run over other prompts is refused, naming it.
  _run(tmp_path / "runs" / "c" / "seed0", config, np.zeros(5), np.zeros(5))
  with pytest.raises(ValueError, match="c/seed0 evaluated 5 prompts"):
    SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["x", f"--root={tmp_path}"]))


def test_a_task_without_domains_is_named(tmp_path):
  config = load_module(ROOT / "configs" / "grpo_arith.py").get_config("runlocal")
  _run(tmp_path / "run", config, np.zeros(1), np.zeros(1))
  with pytest.raises(ValueError, match="is not a mixture"):
    SCRIPT.prompt_domains(tmp_path / "run")
