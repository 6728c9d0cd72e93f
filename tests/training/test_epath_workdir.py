"""Workdirs as `etils.epath` paths: local ones unchanged, `gs://` ones keep their scheme.

A gs:// workdir is faked with `epath.testing.mock_epath`, every `gs://bucket/…` operation
redirected to a local folder: the metric writer (staged, then uploaded whole), the eval outcome
files and the resume policy run on it. Orbax cannot be carried by that fake: it writes arrays
through TensorStore's own GCS driver, which epath's mock never sees. Two local GCS emulators
were tried for that part and neither carries an orbax save: `gcp-storage-emulator` ignores
generation preconditions and omits `x-goog-generation` on reads (TensorStore's OCDBT manifest
update fails with "Malformed StorageGeneration"), and `fake-gcs-server` hung in gcsfs's
`exists` during orbax's commit. So orbax is tested here on a local `epath.Path` workdir (the
same code path; orbax takes any epath path), and `as_path` is checked to keep the gs:// scheme
that orbax's `Checkpointer` then receives.
"""

import contextlib
import os
from pathlib import Path

import jax
import numpy as np
from etils import epath
from etils.epath import testing as epath_testing
from regression_method import Regression, regression_config

from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.base_configs import loop_config
from jaxrl_post.training.checkpoint import Checkpointer, as_path, resolve_start
from jaxrl_post.training.metrics import (
  MetricWriter,
  read_eval_outcomes,
  read_metrics,
  write_eval_outcomes,
)

PREFIX = "gs://"


@contextlib.contextmanager
def fake_gcs(root: Path):
  """epath's `gs://x/y` operations act on `root/x/y`; local paths are left alone."""

  def local(path):
    path = os.fspath(path)
    return str(root / path[len(PREFIX):]) if path.startswith(PREFIX) else path

  def one(fn, path, *args, **kwargs):
    return fn(local(path), *args, **kwargs)

  def two(fn, path, dst, *args, **kwargs):
    return fn(local(path), local(dst), *args, **kwargs)

  def glob(fn, pattern):
    found = fn(local(pattern))
    if not os.fspath(pattern).startswith(PREFIX):
      return found
    return [PREFIX + os.path.relpath(f, root) for f in found]

  with epath_testing.mock_epath(open=one, exists=one, isdir=one, listdir=one, makedirs=one,
                                mkdir=one, remove=one, rmtree=one, stat=one, walk=one, glob=glob,
                                rename=two, replace=two, copy=two):
    yield


def test_local_workdirs_become_absolute_epath_paths(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert as_path("run") == epath.Path(tmp_path / "run")
  assert isinstance(as_path("run"), epath.Path)
  # A URI keeps its scheme (absolute() would have prefixed the working directory).
  assert os.fspath(as_path("gs://bucket/run")) == "gs://bucket/run"
  assert Checkpointer("run/checkpoints").directory == epath.Path(tmp_path / "run/checkpoints")


def test_metrics_eval_outcomes_and_resume_policy_on_a_fake_gs_workdir(tmp_path):
  bucket = tmp_path / "gcs"
  workdir = "gs://bucket/run"
  with fake_gcs(bucket):
    writer = MetricWriter(workdir, sync_every_s=1e9)  # uploads only on flush / close
    writer.write_config({"lr": 0.1})
    for step in (1, 2, 3):
      writer.write(step, {"loss": float(step), "nan": float("nan")})
    # Nothing appended remotely yet (object stores cannot append): a staged copy.
    assert read_metrics(workdir) == []
    writer.flush()
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3]
    writer.write(4, {"loss": 4.0})
    writer.close()
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3, 4]
    assert list((bucket / "bucket/run/tensorboard").glob("events.out.tfevents.*"))
    assert (bucket / "bucket/run/config.json").exists()

    # A resume from step 2 rewrites the history after it, remotely too.
    writer = MetricWriter(workdir, resume_step=2, tensorboard=False)
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2]
    writer.write(3, {"loss": 30.0})
    writer.close()
    assert [r["loss"] for r in read_metrics(workdir)] == [1.0, 2.0, 30.0]

    write_eval_outcomes(workdir, 5, correct=[1.0, float("nan")])
    got = read_eval_outcomes(workdir)
    assert list(got) == [5]
    np.testing.assert_array_equal(got[5]["correct"], [1.0, np.nan])

    # The resume policy finds steps in a gs:// checkpoint directory and keeps the scheme.
    (bucket / "bucket/run/checkpoints/7").mkdir(parents=True)
    (bucket / "bucket/run/checkpoints/12").mkdir()
    start = resolve_start(f"{workdir}/checkpoints")
    assert start.kind == "workdir" and start.step == 12
    assert os.fspath(start.path) == "gs://bucket/run/checkpoints"
    other = resolve_start("gs://bucket/elsewhere", resume=workdir)
    assert other.kind == "resume" and os.fspath(other.path) == "gs://bucket/run/checkpoints"
    assert run_setup.start_point(loop_config(), workdir) == start
    assert os.fspath(run_setup.checkpoint_dir(workdir)) == "gs://bucket/run/checkpoints"


# ---- A whole run on an emulated GCS bucket ----


def test_a_run_in_an_epath_workdir_checkpoints_and_resumes_exactly(tmp_path):
  workdir = epath.Path(tmp_path) / "run"
  loop.train(regression_config(steps=4), workdir, Regression(regression_config()))
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [2, 4]
  method = Regression(regression_config())
  state = loop.train(regression_config(), workdir, method)
  records = [r for r in read_metrics(workdir) if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  assert method.rows_seen == 48  # the method's state came back

  # The same six steps without a stop: the same parameters (the resume was exact).
  reference = loop.train(regression_config(), tmp_path / "uninterrupted",
                         Regression(regression_config()))
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
