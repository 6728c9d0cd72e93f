"""The benchmark scripts run end to end on tiny settings and print parseable JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _json_lines(script, *args):
  result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args],
                          capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
                          env=dict(os.environ, XLA_FLAGS=""))
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_bench_train_step_reports_the_phase_split_and_mfu():
  peak, step = _json_lines("bench_train_step.py", "--config=configs/grpo_arith.py:runlocal",
                           "--steps=1", "--matmul_n=256", "--skip_trl")
  assert peak["what"] == "matmul_peak" and peak["flops_per_s"] > 0
  assert step["what"] == "grpo_step" and step["engine"] == "jaxrl_post" and step["rollouts"] == 8
  shares = {k: step[f"share/{k}"] for k in ("generate", "reward", "score", "reference", "update")}
  assert abs(sum(shares.values()) - 1) < 1e-6
  assert shares.pop("reference") == 0  # beta = 0: no reference model, as in experiments/grpo.py
  assert all(s > 0 for s in shares.values())
  assert step["update_tokens_per_s"] > 0 and 0 < step["update_mfu"]


def test_bench_train_step_runs_on_one_device_per_core():
  peak, step = _json_lines("bench_train_step.py", "--config=configs/grpo_arith.py:runlocal",
                           "--steps=1", "--matmul_n=128", "--skip_trl", "--cpu_devices=2",
                           "--config.ppo_mini_batches=1", "--config.rollout.old_logp=detached")
  # The reference matmul runs on both devices; the step's rows are split over them.
  assert peak["devices"] == 2 and step["devices"] == 2 and step["old_logp"] == "detached"
  assert step["time/generate"] > 0 and step["time/update"] > 0 and step["time/score"] == 0


def test_bench_train_step_times_trl_beside_ours():
  pytest.importorskip("trl")
  rows = _json_lines("bench_train_step.py", "--config=configs/grpo_arith.py:runlocal",
                     "--steps=1", "--matmul_n=256", "--config.max_new_tokens=4")
  assert [r["what"] for r in rows] == ["matmul_peak", "grpo_step", "grpo_step", "grpo_step_ratio"]
  assert [r["engine"] for r in rows[1:3]] == ["jaxrl_post", "trl"]
  assert rows[2]["rollouts"] == 8 and rows[2]["time/generate"] > 0 and rows[2]["time/update"] > 0
  assert rows[3]["step_speedup"] > 0 and rows[3]["update_speedup"] > 0


def test_bench_model_reports_fraction_of_peak():
  rows = _json_lines("bench_model.py", "--models=tiny", "--attention_impl=xla", "--batch=2",
                     "--seq_len=16", "--repeats=1", "--matmul_n=256")
  assert [r["what"] for r in rows] == ["matmul_peak", "forward"]
  assert rows[1]["tokens_per_s"] > 0 and rows[1]["fraction_of_matmul_peak"] > 0


def test_bench_moe_reports_both_dispatches_and_their_agreement():
  rows = _json_lines("bench_moe.py", "--tokens=32", "--embed=16", "--moe_mlp=8", "--experts=4",
                     "--repeats=1", "--matmul_n=128")
  assert [r["what"] for r in rows] == ["matmul_peak", "moe_block", "moe_block"]
  assert [r["impl"] for r in rows[1:]] == ["dense", "ragged"]
  assert all(r["seconds"] > 0 and r["temp_bytes"] > 0 for r in rows[1:])
  assert rows[2]["max_abs_diff_vs_dense"] < 1e-5  # the two dispatches compute the same block


def test_bench_crystal_schedules_match_native_gradient():
  rows = _json_lines("bench_crystal_schedules.py", "--runlocal", "--repeats=1")
  assert [r["schedule"] for r in rows] == ["native", "retain", "reweight"]
  assert all(r["seconds"] > 0 and r["max_grad_diff_rel"] < 1e-4 for r in rows)


def test_bench_scaling_matches_the_1_device_loss_on_every_layout():
  rows = _json_lines("bench_scaling.py", "--model=tiny", "--rows=4", "--prompt_len=4",
                     "--completion_len=8", "--repeats=1", "--max_devices=2")
  assert [r["what"] for r in rows] == ["reference_1_device", "grpo_update", "grpo_update"]
  assert [r["layout"] for r in rows[1:]] == ["data=2", "fsdp=2"]
  assert rows[0]["seconds"] > 0 and all(r["time_vs_1_device"] > 0 for r in rows[1:])
  assert all(r["loss_matches"] for r in rows[1:]), rows


def test_bench_brax_reports_compile_time_and_steps_per_s():
  # Two -O0 XLA compiles (CartPole ~4 s, PPO + brax reacher ~14 s): ~30 s on 2 busy cores.
  ref, row = _json_lines("bench_brax.py", "--envs=reacher", "--num_envs=2", "--num_steps=8",
                         "--updates=1", "--repeats=1", "--fast_compile")
  assert ref["what"] == "reference_cartpole" and ref["steps_per_s"] > 0
  assert row["what"] == "ppo_brax" and row["env"] == "reacher"
  assert row["env_steps"] == 16 and row["normalize_obs"] and row["normalize_reward"]
  assert row["compile_s"] > 0 and row["steps_per_s"] > 0 and row["steps_per_s_vs_cartpole"] > 0


def test_bench_sampler_splits_the_host_and_compares_with_transformers():
  rows = _json_lines("bench_sampler.py", "--model=tiny", "--batch=4", "--prompt_len=4",
                     "--max_new_tokens=4", "--group=2", "--repeats=1", "--cpu_devices=2")
  assert [r["what"] for r in rows] == ["sampler", "sampler", "sampler_ratio"] * 2
  ours = [r for r in rows if r.get("engine") == "jaxrl_post"]
  assert [r["case"] for r in ours] == ["n1", "n2"] and all(r["devices"] == 2 for r in ours)
  assert all(r["decode_tokens_per_s"] > 0 and r["ttft_s"] > 0 for r in rows if "engine" in r)
  assert all(r["decode_speedup"] > 0 for r in rows if r["what"] == "sampler_ratio")


def test_bench_update_reports_mfu_and_a_torch_reference():
  rows = _json_lines("bench_update.py", "--model=tiny", "--batch=2", "--prompt_len=8",
                     "--completion_len=24", "--param_dtype=float32", "--dtype=float32",
                     "--peak_tflops=0", "--matmul_n=128", "--steps=1", "--torch_reference")
  assert [r["what"] for r in rows] == ["matmul_peak", "update", "update", "update_ratio"]
  ours, theirs = rows[1], rows[2]
  assert (ours["engine"], theirs["engine"]) == ("jaxrl_post", "torch")
  assert ours["seq_len"] == 32 and ours["seconds"] > 0 and 0 < ours["mfu_in_run"]
  assert ours["mfu"] is None  # --peak_tflops=0: only the in-run reference
  assert rows[3]["speedup"] > 0


def test_bench_async_compares_modes_against_sync(tmp_path):
  rows = _json_lines("bench_async.py", "--config=configs/grpo_arith.py:runlocal", "--steps=3",
                     "--modes=sync,one_step_off,one_step_off_process", f"--out={tmp_path}",
                     "--eval_examples=2")
  assert [r["what"] for r in rows[:4]] == ["matmul_peak", "async_rollouts", "async_rollouts",
                                          "async_rollouts"]
  # The sampler process samples the in-process producer's rows: the same rewards.
  assert rows[3]["mode"] == "one_step_off_process"
  assert rows[3]["final_reward"] == rows[2]["final_reward"]
  assert rows[3]["staleness"] == {"0": 1, "1": 2}
  rows = rows[:3] + [r for r in rows[4:] if r["mode"] == "one_step_off"]
  sync, off = rows[1], rows[2]
  assert sync["staleness"] == {"0": 3} and off["staleness"] == {"0": 1, "1": 2}
  assert sync["devices"] == 2 and off["steps_per_hour"] > 0 and off["weight_sync_s"] > 0
  assert rows[3]["mode"] == "one_step_off" and rows[3]["reference"] == "sync"
  assert (tmp_path / "async_rollouts.png").stat().st_size > 0


@pytest.mark.slow  # five short runs (≈ 40 s)
def test_bench_multi_lora_counts_the_base_once():
  rows = _json_lines("bench_multi_lora.py", "--model=tiny", "--tenants=1,2", "--steps=2",
                     "--rank=4")
  assert [r["what"] for r in rows] == ["single_lora", "full", "multi_lora", "ratio",
                                       "multi_lora", "ratio"]
  single, full, one, _, two, ratio = rows
  assert full["base_bytes"] == 0 and single["base_bytes"] > 0
  # One tenant is a single-LoRA run; a second adds its adapters and moments, not a base.
  assert one["resident_bytes"] == single["resident_bytes"]
  assert two["resident_bytes"] == single["resident_bytes"] + single["state_bytes"]
  assert 0.5 < ratio["vs_single_lora_runs"] < 1 and ratio["tenants"] == 2


def test_device_checks_script_passes_valid_flags_to_every_step(tmp_path):
  """scripts/device_checks.sh (the one command for a GPU lease): every step's flags parse at the
  GPU sizes, and nothing is written but the three files the device tool brings back. (Its
  `tiny` mode runs the same steps end to end on CPU in ≈ 2 minutes; not run here.)"""
  result = subprocess.run(["bash", str(ROOT / "scripts" / "device_checks.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
                          env=dict(os.environ, CHECK_ARGS="1", PYTHON=sys.executable,
                                   XLA_FLAGS=""))
  assert result.returncode == 0, result.stderr[-2000:]
  summary = (tmp_path / "summary.txt").read_text()
  for step in ("update16", "sampler", "sampler256", "long_tail", "sampler1p7b", "update4"):
    assert f"{step} rc=0" in summary, summary
  assert sorted(p.name for p in tmp_path.iterdir()) == ["logs.txt", "results.jsonl",
                                                         "summary.txt"]
