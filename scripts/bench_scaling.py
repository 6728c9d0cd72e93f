r"""The jitted GRPO update step on 1/2/4/8-way data and FSDP meshes of a fake 8-device CPU host.

  python scripts/bench_scaling.py                    # `small`, 32 rows × 80 tokens
  python scripts/bench_scaling.py --model=tiny --rows=64 --repeats=5

The step is `make_train_step` with the GRPO policy loss that
`experiments/grpo.py` builds (`training.objectives.make_policy_loss`, `grpo_base()` loss
settings), on a random rollout batch. Each layout gets its own mesh over the
first n devices (`mesh_config(ici=dict(data=n))` or `dict(fsdp=n)` with the
training rules), a train state born sharded on it, and the batch placed with
`put_batch`. Prints JSON lines: first the 1-device reference
  {"what": "reference_1_device", "seconds": ...}
then one row per layout
  {"what": "grpo_update", "layout": "fsdp=4", "devices": 4, "seconds": ...,
   "time_vs_1_device": ..., "loss": ..., "loss_rel_diff": ..., "loss_matches": ...}
with the median seconds of one update over `--repeats` calls after a warm-up
(compile) call, and the first update's loss against the 1-device loss (the
parameters are equal at that point, so only float summation order differs).

On the fake CPU host the 8 "devices" are threads on the same cores, so no
layout can be faster than 1 device: `time_vs_1_device` measures what
partitioning costs (collectives, smaller per-device kernels), which is the
overhead a real multi-chip run pays on top of its speed-up. The same script
on an accelerator host (without the fake-device flag taking effect) measures
real scaling.
"""

import os

# Before JAX is imported: the fake devices exist only if XLA sees this flag first.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_post.benchmarking import median_seconds  # noqa: E402
from jaxrl_post.models import CausalLM, get_model_config  # noqa: E402
from jaxrl_post.parallel.mesh import get_rules, make_mesh, mesh_config, put_batch  # noqa: E402
from jaxrl_post.training import base_configs  # noqa: E402
from jaxrl_post.training.objectives import make_policy_loss  # noqa: E402
from jaxrl_post.training.ppo import with_normalizers  # noqa: E402
from jaxrl_post.training.train_state import create_train_state, make_train_step  # noqa: E402

_MODEL = flags.DEFINE_string("model", "small", "Model preset.")
_ROWS = flags.DEFINE_integer("rows", 32, "Rollouts per update (divisible by --max_devices).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens per row.")
_COMPLETION_LEN = flags.DEFINE_integer("completion_len", 64, "Completion tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed updates per layout (median).")
_RTOL = flags.DEFINE_float("rtol", 1e-5, "Relative loss difference that still matches.")
_MAX_DEVICES = flags.DEFINE_integer("max_devices", 8, "Largest mesh (a power of two).")


def _batch(vocab_size: int, seed: int = 0) -> dict:
  """A random rollout batch: ragged completions, signed advantages, nearby old log-probs."""
  rng = np.random.default_rng(seed)
  rows, p, c = _ROWS.value, _PROMPT_LEN.value, _COMPLETION_LEN.value
  lengths = rng.integers(c // 4, c + 1, rows)
  batch = dict(
    prompt_tokens=rng.integers(3, vocab_size, (rows, p)).astype(np.int32),
    prompt_mask=np.ones((rows, p), bool),
    completion_tokens=rng.integers(3, vocab_size, (rows, c)).astype(np.int32),
    completion_mask=np.arange(c)[None, :] < lengths[:, None],
    adv=rng.normal(size=rows).astype(np.float32),
    # Old log-probs near the policy's (≈ -log V for a fresh model), so the
    # PPO ratios are near 1 and some are clipped, as in a real update.
    old_logp=(-np.log(vocab_size) + 0.1 * rng.normal(size=(rows, c))).astype(np.float32))
  return with_normalizers(batch)


def _layouts() -> list[tuple[str, dict[str, int]]]:
  layouts = [("1 device", {"data": 1})]  # data=1 and fsdp=1 are the same mesh
  for axis in ("data", "fsdp"):
    layouts += [(f"{axis}={n}", {axis: n}) for n in (2, 4, 8)
                if n <= min(_MAX_DEVICES.value, jax.device_count())]
  return layouts


def _time_layout(ici: dict[str, int], model_config, loss_fn, optimizer, batch):
  """(median seconds of one update, first update's loss) on a mesh of `prod(ici)` devices."""
  config = mesh_config(ici=ici)
  devices = jax.devices()[:int(np.prod(list(ici.values())))]
  mesh, rules = make_mesh(config, devices=devices), get_rules(config.train_rules)
  model = CausalLM(model_config, rngs=nnx.Rngs(0))  # Equal parameters for every layout.
  state = create_train_state(model, optimizer, jax.random.key(0), mesh=mesh, rules=rules)
  step_fn = make_train_step(nnx.split(model)[0], loss_fn, optimizer, mesh=mesh, rules=rules,
                            shared=("num_tokens", "num_sequences"))
  placed = put_batch(batch, mesh, rules)
  state, metrics = step_fn(state, placed)  # Compiles; the loss of the initial parameters.
  loss = float(metrics["loss"])

  def update():
    nonlocal state  # The state is donated: each update consumes the last one.
    state, metrics = step_fn(state, placed)
    jax.block_until_ready(metrics)

  return median_seconds(update, _REPEATS.value), loss


def main(argv):
  del argv
  if _ROWS.value % _MAX_DEVICES.value:
    raise ValueError(f"--rows={_ROWS.value} must be divisible by --max_devices="
                     f"{_MAX_DEVICES.value}, so that every mesh splits the rows")
  model_config = get_model_config(_MODEL.value)
  loss_config = base_configs.grpo_base().loss
  loss_fn = make_policy_loss(policy_loss=loss_config.name,
                                **{k: v for k, v in loss_config.items() if k != "name"})
  optimizer = optax.adamw(1e-5)
  batch = _batch(model_config.vocab_size)
  common = dict(model=_MODEL.value, params_m=round(model_config.num_params() / 1e6, 2),
                rows=_ROWS.value, seq_len=_PROMPT_LEN.value + _COMPLETION_LEN.value,
                backend=jax.default_backend())
  reference_seconds = reference_loss = None
  for name, ici in _layouts():
    seconds, loss = _time_layout(ici, model_config, loss_fn, optimizer, batch)
    if reference_seconds is None:
      reference_seconds, reference_loss = seconds, loss
      print(json.dumps({"what": "reference_1_device", "layout": name, "devices": 1,
                        "seconds": seconds, "loss": loss, **common}), flush=True)
      continue
    rel = abs(loss - reference_loss) / max(abs(reference_loss), 1e-12)
    print(json.dumps({"what": "grpo_update", "layout": name, "devices": int(np.prod(
      list(ici.values()))), "seconds": seconds, "time_vs_1_device": seconds / reference_seconds,
      "loss": loss, "loss_rel_diff": rel, "loss_matches": rel <= _RTOL.value, **common}),
      flush=True)


if __name__ == "__main__":
  app.run(main)
