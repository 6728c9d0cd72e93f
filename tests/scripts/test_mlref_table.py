"""scripts/mlref_table.py: tables and stability numbers from a hand-written fitness.jsonl."""

import json
from pathlib import Path

import numpy as np
import pytest
from absl import app

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "mlref_table.py")


def test_stability_counts_drops_and_new_bests():
  # Pipeline 0 climbs (2 new bests, no drop); pipeline 1 oscillates (1 drop, 1 new best).
  s = SCRIPT.stability(np.array([[1.0, 2.0, 3.0], [5.0, 1.0, 6.0]]))
  assert s["drop_rate"] == pytest.approx(1 / 4)
  assert s["new_best_rate"] == pytest.approx(3 / 4)
  assert s["round_std"] == pytest.approx(np.mean([np.std([1, 2, 3]), np.std([5, 1, 6])]))
  np.testing.assert_allclose(s["late"], [2.5, 3.5])  # Rounds 2-3 of each pipeline.


def test_tables_and_plot_from_fitness_jsonl(tmp_path):
  rows = []
  for p, curve in enumerate([(10.0, 30.0, 20.0), (12.0, 40.0, 50.0)]):
    best = -np.inf
    for i, v in enumerate(curve, start=1):
      best = max(best, v)
      rows.append({"method": "mlref", "pipeline": p, "iteration": i, "round_best": v,
                   "best_so_far": best})
  rows += [{"method": "env_reward", "pipeline": p, "iteration": 1, "round_best": 300.0 + p,
            "best_so_far": 300.0 + p} for p in range(2)]
  (tmp_path / "fitness.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  results = SCRIPT.load(tmp_path)
  assert results["mlref"].shape == (2, 3, 2)
  text = SCRIPT.tables(results)
  best_row = next(line for line in text.splitlines() if line.startswith("| MLREF"))
  assert best_row == "| MLREF (pool + hybrid credit) | 11.0 ± 1.0 | 35.0 ± 5.0 | 40.0 ± 10.0 |"
  assert "| PPO on the env reward (reference) | 300.5 ± 0.5 | – | – |" in text
  assert "| MLREF (pool + hybrid credit) | 2 | " in text and "| 30.0, 50.0 |" in text
  assert "| 35.0 ± 10.0 | 30.0, 50.0 |" in text  # Late rounds: (30 + 20) / 2, (40 + 50) / 2.
  assert "| PPO on the env reward (reference) | 2 | – | – | – | – | 300.0, 301.0 |" in text
  SCRIPT.plot(results, tmp_path / "p.png")
  assert (tmp_path / "p.png").stat().st_size > 0
  # The command line `mlref_table.py WORKDIR --plot=PNG` (absl flags; the workdir positional).
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["mlref_table.py", str(tmp_path),
                                                f"--plot={tmp_path / 'cli.png'}"]))
  assert (tmp_path / "cli.png").stat().st_size > 0
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["mlref_table.py", str(tmp_path)]))
  assert (tmp_path / "mlref_fitness.png").stat().st_size > 0  # --plot's default.
  with pytest.raises(app.UsageError, match="one workdir"):
    SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["mlref_table.py"]))
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "fitness.jsonl").write_text("")
  with pytest.raises(ValueError, match="empty"):
    SCRIPT.load(tmp_path / "empty")
