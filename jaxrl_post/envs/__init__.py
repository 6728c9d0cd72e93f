"""Multi-turn text environments with tools, context functions and trajectory records.

  env = get_env("calculator", horizon=3)          # or "kv_lookup"
  prompt = env.reset(0)
  result = env.step("<tool>calc(7543-517)</tool>")  # StepResult(observation, reward, done, info)
  saved = env.snapshot(); ...; env.restore(saved)  # deterministic replay from any turn

  trajectory = play(env, env.demonstration("train", 0), index=0, context=drop_reasoning())
  arrays = to_tokens(trajectory, tokenizer, max_len=512)  # tokens, action_mask, turn_ids, ...

Registered environments (`ENVS`): `"calculator"` (a chain of K operations on large numbers,
one `calc` call each) and `"kv_lookup"` (follow K keys through a hidden store with `get`).
Modules: `base` (protocol, state, registry), `tools` (the action format, its parser, running a
tool under a time limit), one module per env, and `context` (context functions ψ, `Turn` /
`Trajectory`, `play`, token arrays with action masks).
"""

from jaxrl_post.envs import base, calculator, context, kv_lookup, tools
from jaxrl_post.envs.base import (
  ACTION,
  ENVS,
  OBSERVATION,
  PROMPT,
  Env,
  EnvState,
  Episode,
  Segment,
  StepResult,
  get_env,
)
from jaxrl_post.envs.calculator import CalculatorEnv
from jaxrl_post.envs.context import (
  CONTEXTS,
  ContextFn,
  Trajectory,
  Turn,
  TurnTokens,
  drop_reasoning,
  identity,
  make_context,
  play,
  render,
  to_tokens,
  truncate,
  turn_to_tokens,
)
from jaxrl_post.envs.kv_lookup import KVLookupEnv
from jaxrl_post.envs.tools import (
  STOP_STRINGS,
  Action,
  ToolError,
  ToolResult,
  call_tool,
  parse_action,
)

__all__ = [
  "ACTION",
  "CONTEXTS",
  "ENVS",
  "OBSERVATION",
  "PROMPT",
  "STOP_STRINGS",
  "Action",
  "CalculatorEnv",
  "ContextFn",
  "Env",
  "EnvState",
  "Episode",
  "KVLookupEnv",
  "Segment",
  "StepResult",
  "ToolError",
  "ToolResult",
  "Trajectory",
  "Turn",
  "TurnTokens",
  "base",
  "calculator",
  "call_tool",
  "context",
  "drop_reasoning",
  "get_env",
  "identity",
  "kv_lookup",
  "make_context",
  "parse_action",
  "play",
  "render",
  "to_tokens",
  "tools",
  "truncate",
  "turn_to_tokens",
]
