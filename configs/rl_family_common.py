"""The miniature tasks the RL-family configs share (configs/trajval.py, rapo.py,
headroom_drift.py, cokl.py): `set_task(config, name, runlocal)`.

  mixture   Open-MOPD's 2 : 2 : 1 mixture (arithmetic, two-number countdown, format following;
            configs/opd_mix.py) — uneven difficulty across domains, what task priors, replay and
            risk scaling act on. Student: its mixed SFT,
              python experiments/sft.py --config=configs/opd_mix.py:sft --workdir=$R/sft
  arith     arithmetic with 1-3 digit operands (+ and −): uneven difficulty inside one task for
            a student fine-tuned on 1-2 digits (configs/sft_arith.py).

`runlocal` keeps arithmetic (the tests' format-writing policy earns its format reward) unless a
task is named.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module

TASKS = ("mixture", "arith")


def set_task(config, name: str, runlocal: bool) -> None:
  name = name or ("arith" if runlocal else "mixture")
  if name not in TASKS:
    raise ValueError(f"task={name!r}; valid: {', '.join(TASKS)}")
  if name == "mixture":
    opd_mix = load_module(Path(__file__).resolve().with_name("opd_mix.py"))
    config.task = "mixture"
    config.task_knobs = dict(components=opd_mix.COMPONENTS)
    config.prompt_len = opd_mix.PROMPT_LEN
    config.max_new_tokens = opd_mix.COMPLETION_LEN
  else:
    config.task = "arith"
    config.task_knobs = dict(min_digits=1, max_digits=3, num_operands=2, operations="+-",
                             demo_slip=0.0)
