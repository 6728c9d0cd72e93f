r"""Cost of legal-token decoding: `Sampler.generate` / `Sampler.score` with and without the
PertMind grammar (`sampling.grammar`), same model, prompts and shapes. Prints JSON lines.

  python scripts/pertmind_bench_grammar.py --model=tiny --rows=64 --repeats=5
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.sampling import Sampler, grammar
from jaxrl_post.tasks import get_task
from jaxrl_post.tokenizers import CharTokenizer


def timed(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # compile
  times = []
  for _ in range(repeats):
    tic = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - tic)
  return float(np.median(times))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="tiny")
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  tok = CharTokenizer()
  task = get_task("pertmind")
  gram = grammar.from_slots(tok, task.grammar_slots())
  model = CausalLM(get_model_config(args.model, vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
  prompts = [task.make_example("train", i)["prompt"] for i in range(args.rows // 8)]
  for name, g in (("unconstrained", None), ("grammar", gram)):
    sampler = Sampler(model, tok, max_prompt_len=64, grammar=g)
    kw = dict(n_samples_per_prompt=8, max_new_tokens=32, rng=jax.random.key(0))
    # Fixed length (no EOS) for a like-for-like decode time.
    sampler.eos_ids = () if g is None else sampler.eos_ids
    generate = lambda s=sampler, kw=kw: s.generate(None, prompts, **kw).completion_tokens  # noqa: E731
    rollout = sampler.generate(None, prompts, **kw)
    score = lambda s=sampler, r=rollout: s.score(  # noqa: E731
      None, r.prompt_tokens, r.prompt_mask, r.completion_tokens, r.completion_mask).logp
    print(json.dumps(dict(mode=name, model=args.model, rows=args.rows, new_tokens=32,
                          states=None if g is None else g.num_states,
                          generate_s=timed(generate, args.repeats),
                          score_s=timed(score, args.repeats),
                          mean_length=float(np.asarray(rollout.completion_mask).sum(1).mean()))),
          flush=True)


if __name__ == "__main__":
  main()
