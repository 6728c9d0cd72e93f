"""Golden sharding dumps: parameter path → shape → PartitionSpec, per (preset, mesh, rules).

A change to logical axis names, rule tables or `logical_to_spec` that moves a
parameter to another mesh axis shows up here as a readable diff, before it
shows up as an OOM or a slow step on a pod. The dumps are built from shapes
only (`nnx.eval_shape`), so 8B presets cost nothing.

To accept an intended change, regenerate the files and review the diff:
  JAXRL_POST_UPDATE_GOLDEN=1 pytest tests/parallel/test_golden_shardings.py
"""

import difflib
import os
from pathlib import Path

import pytest
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.parallel import mesh as mesh_lib
from jaxrl_post.parallel.axes import state_shardings

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE = os.environ.get("JAXRL_POST_UPDATE_GOLDEN", "") not in ("", "0")

# (preset, ici sizes, rule table, scan_layers): the trainer layouts of an 8B
# model on one 8-chip host, its sampler layout, and two smaller presets with
# tied embeddings / q-k-v biases / 2 kv heads (which 4 tensor shards cannot
# split), with unrolled layers (one entry per layer); and the same 8B layouts
# with the presets' default scanned layers (one `[layers, ...]` entry per weight).
CASES = [
  ("qwen3_8b", dict(fsdp=8), "fsdp_tensor", False),
  ("qwen3_8b", dict(fsdp=2, tensor=4), "fsdp_tensor", False),
  ("qwen3_8b", dict(data=2, tensor=4), "tensor", False),
  ("llama3p2_1b", dict(fsdp=4, tensor=2), "fsdp_tensor", False),
  ("qwen2p5_1p5b", dict(fsdp=2, tensor=4), "fsdp_tensor", False),
  ("qwen3_8b", dict(fsdp=8), "fsdp_tensor", True),
  ("qwen3_8b", dict(data=2, tensor=4), "tensor", True),
  ("smollm3_3b", dict(fsdp=4, tensor=2), "fsdp_tensor", True),
]


def _case_name(preset, ici, rules, scan_layers):
  mesh = "_".join(f"{axis}{size}" for axis, size in ici.items())
  return f"{preset}__{mesh}__{rules}" + ("__scanned" if scan_layers else "")


def sharding_dump(preset: str, ici: dict, rules: str, scan_layers: bool) -> str:
  """One line per parameter: `path  shape  spec`, after a header naming the case."""
  config = get_model_config(preset, scan_layers=scan_layers)
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=ici))
  _, abstract = mesh_lib.abstract_module(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  shardings = state_shardings(abstract, mesh, mesh_lib.get_rules(rules))
  lines = [f"# {preset} on mesh {dict(mesh.shape)} with rules {rules!r}"
           + (" and scanned layers" if scan_layers else "")]
  for (path, variable), (_, sharding) in zip(nnx.to_flat_state(abstract),
                                            nnx.to_flat_state(shardings)):
    name = ".".join(str(p) for p in path)
    shape = tuple(variable.get_value().shape)
    lines.append(f"{name}  {shape}  {sharding.get_value().spec}")
  return "\n".join(lines) + "\n"


@pytest.mark.parametrize("preset, ici, rules, scan_layers", CASES,
                         ids=[_case_name(*c) for c in CASES])
def test_sharding_matches_golden(preset, ici, rules, scan_layers):
  path = GOLDEN_DIR / f"{_case_name(preset, ici, rules, scan_layers)}.txt"
  dump = sharding_dump(preset, ici, rules, scan_layers)
  if UPDATE:
    GOLDEN_DIR.mkdir(exist_ok=True)
    path.write_text(dump)
    pytest.skip(f"regenerated {path.name}")
  assert path.exists(), f"{path} is missing; run with JAXRL_POST_UPDATE_GOLDEN=1"
  expected = path.read_text()
  if dump != expected:
    diff = "".join(difflib.unified_diff(expected.splitlines(True), dump.splitlines(True),
                                        f"golden/{path.name}", "now"))
    pytest.fail(f"shardings changed (JAXRL_POST_UPDATE_GOLDEN=1 to accept):\n{diff[:6000]}")


def test_golden_files_have_no_orphans():
  expected = {f"{_case_name(*c)}.txt" for c in CASES}
  assert {p.name for p in GOLDEN_DIR.glob("*.txt")} == expected
