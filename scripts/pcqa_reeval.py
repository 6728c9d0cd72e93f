r"""Re-evaluates the LM runs of a PCQA grid workdir with the mean of K sampled scores.

  python scripts/pcqa_reeval.py --workdir=/tmp/pcqa_grid --out=docs/pcqa_table_sampled.md

Greedy evaluation of the GRPO runs gave one constant score per test set (PLCC / SRCC undefined,
counted 0). This restores each LM run's final params (`seed_*/<method>/checkpoints`), predicts
every test cloud as the mean of `--num_samples` (8) answers sampled at the training rollout
temperature (`config.grpo.temperature`; unparseable samples dropped from the mean, a cloud with
no parseable sample falls back to 3.0 and is counted), and writes `final_sampled.json` next to
`final.json`. The regression runs are copied unchanged (`final.json` → `final_sampled.json`).
Then the table (scripts/pcqa_table.py's `aggregate_runs` / `format_table`) goes to `--out` and
stdout.
"""

import json
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags
from flax import nnx

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.methods import pcqa
from jaxrl_post.models import get_model_config
from jaxrl_post.models.point_cloud import PointCloudLM
from jaxrl_post.tasks import point_clouds as pc
from jaxrl_post.tokenizers import get_tokenizer
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer

LM_METHODS = ("sft", "rank", "rank_gauss", "full")
METHODS = (*LM_METHODS, "regression")
OUT_NAME = "final_sampled.json"

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_WORKDIR = flags.DEFINE_string("workdir", None, "the grid's workdir (scripts/pcqa_grid.py)",
                               flag_values=FLAGS, required=True)
_OUT = flags.DEFINE_string("out", None, "markdown table path", flag_values=FLAGS,
                           required=True)
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 8, "sampled answers per cloud",
                                    flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "sampling rng seed", flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "redo runs that have an output", flag_values=FLAGS)


def load_table_module():
  """scripts/pcqa_table.py (its `aggregate_runs` / `format_table`), imported by path."""
  return load_module(Path(__file__).resolve().parent / "pcqa_table.py")


def main(argv: list[str]) -> None:
  """Re-evaluates and writes the table (flags only: `argv` is the program name)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  workdir, num_samples, rng_seed = Path(_WORKDIR.value), _NUM_SAMPLES.value, _SEED.value
  config = json.loads(next(workdir.glob("seed_*/base/config.json")).read_text())
  datasets, source = config["datasets"].split(","), config["source"]
  grid, enc = config["encoder"]["grid"], config["encoder"]

  test = {d: pc.load_split(d, "test", size=config["test_size"] or None,
                           num_points=config["num_points"], grid=grid) for d in datasets}
  tokenizer = get_tokenizer(config["tokenizer"])
  lm_config = get_model_config(config["model"], vocab_size=tokenizer.vocab_size,
                               **dict(config["model_overrides"]))
  model = PointCloudLM(lm_config, num_views=pc.NUM_VIEWS, grid=grid, patch=enc["patch"],
                       channels=len(pc.CHANNELS), width=enc["width"], depth=enc["depth"],
                       rngs=nnx.Rngs(0))
  graphdef, template = nnx.split(model)[0], nnx.state(model, nnx.Param)
  temperature = config["grpo"]["temperature"]
  k = pcqa.build_kernels(graphdef, np.asarray(tokenizer.encode(pcqa.PROMPT), np.int32),
                         num_samples=num_samples, max_new_tokens=config["completion_len"],
                         eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                         temperature=temperature)
  print(f"sampled-mean eval: K={num_samples}, temperature={temperature}, test "
        f"{ {d: len(t.mos) for d, t in test.items()} }", flush=True)

  total = time.perf_counter()
  for seed_dir in sorted(workdir.glob("seed_*")):
    reg = seed_dir / "regression"
    if (reg / "final.json").exists():
      (reg / OUT_NAME).write_text((reg / "final.json").read_text())
    for method in LM_METHODS:
      run_dir = seed_dir / method
      if not (run_dir / "final.json").exists() or (
          (run_dir / OUT_NAME).exists() and not _FORCE.value):
        continue
      tic = time.perf_counter()
      params = Checkpointer(run_setup.checkpoint_dir(run_dir)).restore_params(None, template)
      seed = int(seed_dir.name.split("_")[-1])
      rng = jax.random.fold_in(jax.random.key(rng_seed), seed)
      result = pcqa.evaluate_lm(k, params, tokenizer, test, source=source,
                                batch_size=config["eval_batch"], mode="sampled_mean",
                                num_samples=num_samples, rng=rng)
      result.update({"eval/mode": "sampled_mean", "eval/num_samples": num_samples,
                     "eval/temperature": temperature, "eval/rng_seed": rng_seed,
                     "time/eval": time.perf_counter() - tic})
      (run_dir / OUT_NAME).write_text(json.dumps(result, indent=1) + "\n")
      print(f"{seed_dir.name} {method:10s} ID PLCC/SRCC {result[f'{source}/plcc']:.3f}/"
            f"{result[f'{source}/srcc']:.3f}  OOD-avg {result['ood_avg/plcc']:.3f}/"
            f"{result['ood_avg/srcc']:.3f}  score std "
            f"{[round(result[f'{d}/score_std'], 3) for d in datasets]}  no-valid "
            f"{[round(result[f'{d}/unparseable'], 3) for d in datasets]}  "
            f"({result['time/eval']:.0f}s)", flush=True)
  print(f"total {time.perf_counter() - total:.0f}s", flush=True)

  tables = load_table_module()
  table = tables.aggregate_runs(workdir, METHODS, datasets, source=source, filename=OUT_NAME)
  text = tables.format_table(table, datasets, source=source)
  Path(_OUT.value).write_text(text + "\n")
  print(text)
  for method, row in table.items():
    constant = [row.get(f"{d}/constant", [float("nan")])[0] for d in datasets]
    unparse = [row.get(f"{d}/unparseable", [float("nan")])[0] for d in datasets]
    print(f"{method}: share of seeds with a constant prediction {[round(c, 2) for c in constant]}"
          f"; clouds with no parseable sample {[round(u, 3) for u in unparse]}")


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
