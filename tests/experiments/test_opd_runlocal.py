"""Mixed SFT → Open-MOPD (experiments/opd.py) in runlocal mode: metrics, errors, exact resume,
and the same run on an 8-device mesh."""

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_post.config_args import load_module
from jaxrl_post.methods import opd
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, XLA_FLAGS="")
EIGHT_DEVICES = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
CONFIG = ROOT / "configs" / "opd_mix.py"
DOMAINS = ("arith", "countdown", "format")


def _load_config():
  return load_module(CONFIG, "opd_mix")


def _run(binary, arg, workdir, *extra, check=True, env=ENV):
  command = [sys.executable, str(ROOT / "experiments" / binary), f"--config={CONFIG}:{arg}",
             f"--workdir={workdir}", *extra]
  result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_config_variants():
  module = _load_config()
  for method in module.METHOD_NAMES:
    config = module.get_config(f"method={method},root=/r")
    assert opd.resolve_switches(config.method) == opd.METHODS.get(method)
    assert config.init_from == "/r/sft" and config.teachers.format == "/r/teacher_format"
  assert module.get_config("steps=0").steps == 0 and module.get_config("").steps == 50
  sft = module.get_config("sft")
  assert (sft.task, sft.prompt_len, sft.completion_len) == ("mixture", 96, 72)
  assert module.get_config("runlocal").model == module.get_config("sft,runlocal").model == "tiny"
  with pytest.raises(ValueError, match="unknown method"):
    module.get_config("method=mopd")
  # RouteOPD students: one domain, its teacher only; countdown keeps its two numbers.
  only = module.get_config("only=countdown,root=/r")
  assert list(only.task_knobs.components) == ["countdown"] and list(only.teachers) == ["countdown"]
  assert only.task_knobs.components.countdown.knobs.num_numbers == 2
  with pytest.raises(ValueError, match="only='code' is not a domain"):
    module.get_config("only=code")
  added = []
  module.sweep(lambda **kw: added.append(kw))
  assert len(added) == 3 * len(module.METHOD_NAMES)
  assert {kw["method"] for kw in added} == set(module.METHOD_NAMES) == set(opd.METHODS.names())


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
  """A mixed-SFT runlocal checkpoint: every domain's teacher in the runs below."""
  workdir = tmp_path_factory.mktemp("sft")
  _run("sft.py", "sft,runlocal", workdir)
  assert any("eval/accuracy" in r for r in read_metrics(workdir))
  return workdir


def test_mixed_sft_then_open_mopd_with_sft_teachers_and_exact_resume(sft, tmp_path):

  # A domain without a teacher fails at start-up, before anything compiles.
  failed = _run("opd.py", "runlocal", tmp_path / "bad", f"--config.teachers.arith={sft}",
                check=False)
  assert failed.returncode != 0
  assert "no teacher checkpoint for domain(s) 'countdown', 'format'" in failed.stderr

  # The SFT checkpoint is every domain's teacher; the student starts from scratch, so the
  # distillation signal is not zero (a student equal to its teachers would get r = 0).
  teachers = [f"--config.teachers.{d}={sft}" for d in DOMAINS]
  run = tmp_path / "open_mopd"
  result = _run("opd.py", "runlocal", run, *teachers, env=dict(ENV, JAX_LOG_COMPILES="1"))
  # Every kernel compiles once for the whole run: the update step; the student's full-batch
  # score and the teachers' fixed `rows_per_call` score (shared by all teachers); sampling and
  # greedy evaluation (shared by the student and the RouteRL teachers, all domains).
  compiles = collections.Counter(re.findall(r"Compiling jit\((\w+)\)", result.stderr))
  assert (compiles["step"], compiles["_score"], compiles["jitted_decode"]) == (1, 2, 2), compiles
  records = read_metrics(run)
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [1, 2, 3, 4]
  route = next(r for r in records if "route/total" in r)
  assert route["step"] == 0 and all(f"route/{d}/accuracy" in route for d in DOMAINS)
  evals = [r for r in records if "eval/total" in r]
  assert [r["step"] for r in evals] == [0, 2, 4]
  assert all(f"eval/{d}/accuracy" in r for r in evals for d in DOMAINS)
  for r in train:
    assert r["train/num_updates"] == 4  # open_mopd: K = 4 inner updates
    assert r["train/staleness_kl_last"] > 0  # updates 2..4 saw a moved student
    for d in DOMAINS:
      for key in ("token_share", "prompt_share", "budget_share", "mean_abs_reward", "weight",
                  "gap_factor", "staleness_kl", "clip_frac", "reward_correct"):
        assert f"domain/{d}/{key}" in r, (d, key)
    assert abs(sum(r[f"domain/{d}/token_share"] for d in DOMAINS) - 1) < 1e-5
    assert [r[f"domain/{d}/prompt_share"] for d in DOMAINS] == [3 / 8, 3 / 8, 2 / 8]
    assert r["rollout/topk_logp_abs_diff_max"] < 1e-4  # sampler and trainer agree on s
  checkpoints = run / "checkpoints"
  assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [2, 4]

  # Resume: drop the last checkpoint and rerun the same command. Steps 3-4 are redone from
  # checkpoint 2 (state, quota-sampler position, step-0 references) and match the first run.
  shutil.rmtree(checkpoints / "4")
  _run("opd.py", "runlocal", run, *teachers)
  again = [r for r in read_metrics(run) if "train/loss" in r]
  assert [r["step"] for r in again] == [1, 2, 3, 4]
  for a, b in zip(train, again):
    for key in ("train/loss", "train/reward_mean", "train/staleness_kl_last",
                "rollout/completion_length_mean", "domain/format/token_share",
                "domain/arith/weight"):
      assert abs(a[key] - b[key]) < 1e-5, (key, a["step"], a[key], b[key])
  assert sum("route/total" in r for r in read_metrics(run)) == 1  # not re-evaluated


@pytest.mark.slow
def test_open_mopd_on_a_mesh_matches_one_device(sft, tmp_path):
  """data 2 × fsdp 2 × tensor 2 on a fake 8-device host vs one device: the same steps.

  Student and teachers are sharded alike on the trainer's mesh (batch axes that do not divide
  the 1-2 row micro-batches or the teachers' 3-row calls are dropped, `put_batch`). On 2 loaded
  cores the SFT fixture and the two runs take ≈ 4 min (mostly compilation), hence `slow`.
  """
  teachers = [f"--config.teachers.{d}={sft}" for d in DOMAINS]
  short = ("--config.steps=3", "--config.eval_every=100", "--config.checkpoint_every=100",
           "--config.eval_teachers=False")
  _run("opd.py", "runlocal", tmp_path / "one", *teachers, *short)
  result = _run("opd.py", "runlocal", tmp_path / "eight", *teachers, *short,
                "--config.mesh.ici_data=2", "--config.mesh.ici_fsdp=2",
                "--config.mesh.ici_tensor=2", env=EIGHT_DEVICES)
  assert "trainer mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in result.stderr
  single, sharded = ([r for r in read_metrics(tmp_path / name) if "train/loss" in r]
                     for name in ("one", "eight"))
  assert [r["step"] for r in sharded] == [r["step"] for r in single] == [1, 2, 3]
  assert max(abs(r["train/loss"]) for r in single) > 1e-3  # not a comparison of zeros
  for a, b in zip(single, sharded):
    # The same tokens are sampled (keys by global row), so the task rewards are equal exactly.
    assert b["train/reward_correct"] == a["train/reward_correct"]
    for key in ("train/loss", "train/grad_norm", "train/reward_mean", "train/staleness_kl_last",
                "domain/format/weight", "domain/arith/token_share"):
      # Loss, gradient norm, OPD reward and weights differ only by float32 summation order
      # across shards (carried through 3 × 4 Adam updates), as in test_mesh_runlocal.py:
      # measured ≤ 1e-6 relative. 1e-4 is far below what a per-shard normaliser or weight,
      # or a lost shard of rows, would move. staleness_kl_last (≈ 1e-4, a KL between nearly
      # equal students) moved 8.5e-9 absolute (9e-5 relative): atol covers it.
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6,
                                 err_msg=f"{key} at step {a['step']}")
