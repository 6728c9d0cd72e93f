"""The miniature tasks the RL-family configs share (configs/trajval.py, rapo.py,
headroom_drift.py, cokl.py): `set_task(config, name, runlocal)`.

  mixture   Open-MOPD's 2 : 2 : 1 mixture (arithmetic, two-number countdown, format following;
            configs/opd_mix.py) — uneven difficulty across domains, what task priors, replay and
            risk scaling act on. Student: its mixed SFT,
              python experiments/sft.py --config=configs/opd_mix.py:sft --workdir=$R/sft
  arith     arithmetic with 1-3 digit operands (+ and −): uneven difficulty inside one task for
            a student fine-tuned on 1-2 digits (configs/sft_arith.py).
  mixture/<domain>   one domain of the mixture (arith, countdown, format) with the mixture's
            prompts and lengths: train on it from the mixed student, and `retention_tasks`
            evaluates the other domains (capabilities to keep: CoKL, GCPO, RAPO's forgetting).

`runlocal` keeps arithmetic (the tests' format-writing policy earns its format reward) unless a
task is named.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module

OPD_MIX = load_module(Path(__file__).resolve().with_name("opd_mix.py"))
TASKS = ("mixture", "arith", *(f"mixture/{d}" for d in OPD_MIX.DOMAINS))


def domain_task(domain: str) -> dict:
  """One domain of the mixture as a task spec (`config.task` / `config.task_knobs`)."""
  return dict(task="mixture", task_knobs=dict(components={domain: OPD_MIX.COMPONENTS[domain]}))


def set_task(config, name: str, runlocal: bool) -> None:
  name = name or ("arith" if runlocal else "mixture")
  if name not in TASKS:
    raise ValueError(f"task={name!r}; valid: {', '.join(TASKS)}")
  if name.startswith("mixture"):
    config.task = "mixture"
    domain = name.partition("/")[2]
    config.task_knobs = (domain_task(domain)["task_knobs"] if domain
                         else dict(components=OPD_MIX.COMPONENTS))
    if domain:  # the other domains: what a run on this one should retain
      config.eval_tasks = retention_tasks(domain)
    config.prompt_len = OPD_MIX.PROMPT_LEN
    config.max_new_tokens = OPD_MIX.COMPLETION_LEN
  else:
    config.task = "arith"
    config.task_knobs = dict(min_digits=1, max_digits=3, num_operands=2, operations="+-",
                             demo_slip=0.0)


def retention_tasks(trained: str) -> dict:
  """`config.eval_tasks` for the mixture's domains other than `trained` (their greedy accuracy
  is what a run on `trained` should keep)."""
  if trained not in OPD_MIX.DOMAINS:
    raise ValueError(f"{trained!r} is not a domain of the mixture; valid: "
                     f"{', '.join(OPD_MIX.DOMAINS)}")
  return {d: domain_task(d) for d in OPD_MIX.DOMAINS if d != trained}
