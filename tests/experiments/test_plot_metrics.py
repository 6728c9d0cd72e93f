import sys
from pathlib import Path

from jaxrl_post.training.metrics import MetricWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import plot_metrics  # noqa: E402


def test_plot_writes_a_png(tmp_path):
  for name in ("a", "b"):
    writer = MetricWriter(tmp_path / name, tensorboard=False)
    for step in range(1, 6):
      writer.write(step, {"train/reward": step * 0.1, "eval/accuracy": 0.5, "note": "text"})
    writer.close()
  out = plot_metrics.plot([str(tmp_path / "a"), str(tmp_path / "b")], [], tmp_path / "m.png")
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_named_alike_get_their_distinct_paths_as_labels(tmp_path):
  dirs = [str(tmp_path / row / "seed0") for row in ("grpo", "rail")]
  assert plot_metrics.run_labels(dirs) == {dirs[0]: "grpo/seed0", dirs[1]: "rail/seed0"}
  assert plot_metrics.run_labels([dirs[0]]) == {dirs[0]: "seed0"}
  assert plot_metrics.run_labels([dirs[0], dirs[0] + "/"]) == {dirs[0]: "seed0",
                                                              dirs[0] + "/": "seed0"}
