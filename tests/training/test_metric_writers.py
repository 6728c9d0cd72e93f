"""`config.metric_writers`: W&B and CLU beside JSONL / TensorBoard, from process 0 only.

`wandb` and `clu` are not dependencies: fakes put into `sys.modules` record what the writer
calls, and a module blocked there (`sys.modules[name] = None`) stands for one not installed.
"""

import importlib.machinery
import sys
import types

import jax
import numpy as np
import pytest

from jaxrl_post.training import loop
from jaxrl_post.training.base_configs import loop_config
from jaxrl_post.training.metrics import (
  MetricWriter,
  metric_writer_names,
  read_metrics,
  wandb_run_id,
)


def _module(name, **attributes):
  module = types.ModuleType(name)
  module.__spec__ = importlib.machinery.ModuleSpec(name, None)
  module.__dict__.update(attributes)
  return module


class FakeWandbRun:
  def __init__(self, calls):
    self.calls = calls

  def log(self, data, step):
    self.calls.append(("log", dict(data), step))

  def finish(self):
    self.calls.append(("finish",))


@pytest.fixture
def fake_wandb(monkeypatch):
  calls = []

  def init(**kwargs):
    calls.append(("init", kwargs))
    return FakeWandbRun(calls)

  monkeypatch.setitem(sys.modules, "wandb", _module("wandb", init=init))
  return calls


class FakeCluWriter:
  def __init__(self, calls):
    self.calls = calls

  def write_scalars(self, step, scalars):
    self.calls.append(("write_scalars", step, dict(scalars)))

  def flush(self):
    self.calls.append(("flush",))

  def close(self):
    self.calls.append(("close",))


@pytest.fixture
def fake_clu(monkeypatch):
  calls = []

  def create_default_writer(logdir, **kwargs):
    calls.append(("create", logdir, kwargs))
    return FakeCluWriter(calls)

  writers = _module("clu.metric_writers", create_default_writer=create_default_writer)
  monkeypatch.setitem(sys.modules, "clu", _module("clu", metric_writers=writers))
  monkeypatch.setitem(sys.modules, "clu.metric_writers", writers)
  return calls


METRICS = {"train/loss": np.float32(0.5), "train/done": True, "train/vec": np.ones(2),
           "train/name": "x", "train/steps": 3}


def test_wandb_gets_one_resumable_run_per_workdir_and_the_scalars(tmp_path, fake_wandb):
  config = loop_config()
  config.metric_writers = "jsonl,wandb"
  config.wandb_project = "gsm8k"
  writer = MetricWriter.from_config(config, tmp_path, resume_step=None)
  writer.write(1, METRICS)
  writer.flush()
  writer.close()
  (_, init), log, finish = fake_wandb
  assert init["project"] == "gsm8k" and init["resume"] == "allow"
  assert init["dir"] == str(tmp_path) and init["config"]["wandb_project"] == "gsm8k"
  assert init["id"] == wandb_run_id(tmp_path) == wandb_run_id(str(tmp_path))
  assert wandb_run_id(tmp_path / "other") != init["id"]
  # Only numbers (not bools, vectors or strings), at their step.
  assert log == ("log", {"train/loss": 0.5, "train/steps": 3}, 1)
  assert finish == ("finish",)
  assert [r["step"] for r in read_metrics(tmp_path)] == [1]  # JSONL is always written
  assert not (tmp_path / "tensorboard").exists()


def test_clu_writes_scalars_into_workdir_clu(tmp_path, fake_clu):
  writer = MetricWriter(tmp_path, writers=("jsonl", "tensorboard", "clu"))
  writer.write(2, METRICS)
  writer.flush()
  writer.close()
  assert fake_clu[0][:2] == ("create", str(tmp_path / "clu"))
  assert fake_clu[1:] == [("write_scalars", 2, {"train/loss": 0.5, "train/steps": 3}),
                          ("flush",), ("close",)]
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_only_process_0_writes(tmp_path, fake_wandb, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  writer = MetricWriter(tmp_path / "run", writers="jsonl,wandb")
  writer.write(1, METRICS)
  writer.close()
  assert fake_wandb == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name,package", [("wandb", "wandb"), ("clu", "clu")])
def test_a_missing_package_names_the_config_key_and_the_pip_package(name, package, monkeypatch):
  monkeypatch.setitem(sys.modules, package, None)  # as if not installed
  with pytest.raises(ImportError, match=rf"config.metric_writers includes '{name}'.*"
                                        rf"pip install {package}"):
    metric_writer_names(f"jsonl,{name}")


def test_names_are_validated_before_the_loop_builds_anything(tmp_path):
  assert metric_writer_names(" jsonl , tensorboard,jsonl") == ("jsonl", "tensorboard")
  with pytest.raises(ValueError, match=r"must include 'jsonl'"):
    metric_writer_names("tensorboard")
  config = loop_config()
  config.metric_writers = "jsonl,tensorbord"
  with pytest.raises(ValueError, match=r"config.metric_writers=.*'tensorbord'.*valid: jsonl"):
    loop.train(config, tmp_path, method=None)  # fails before the method is touched
  assert not (tmp_path / "checkpoints").exists()
