"""The AST allow-list for proposed reward-module code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.rewards import module_code as mc

FEATURES = {"x_velocity": (), "height": (), "action": (3,)}

GOOD = '''\
"""Module docstring."""
def forward(f):
  """Saturating forward reward minus an action penalty."""
  v = f["x_velocity"]
  a, h = f["action"], f["height"]
  cost = jnp.sum(jnp.square(a[..., :2]), axis=-1)
  bonus = jnp.where(h > 0.5, 1.0, 0.0)
  bonus += 0.5
  return jnp.tanh(v / 2.0) - 0.1 * cost + bonus * jnp.exp(-jnp.linalg.norm(a, axis=-1)) ** 2
'''


def test_accepts_good_module_and_reports_features():
  info = mc.validate_module_code(GOOD, FEATURES)
  assert info.function_name == "forward"
  assert info.features == ("x_velocity", "action", "height")


def test_compiled_module_runs_under_jit_without_builtins():
  fn = mc.compile_module(GOOD, FEATURES)
  assert set(fn.__globals__["__builtins__"]) == {"__import__"}
  with pytest.raises(ImportError):  # Loads nothing new (and module code cannot name it anyway).
    fn.__globals__["__builtins__"]["__import__"]("antigravity")
  assert set(fn.__globals__) <= {"__builtins__", "__doc__", "jnp", "forward"}
  feats = {"x_velocity": jnp.array([0.0, 2.0]), "height": jnp.array([1.0, 0.0]),
           "action": jnp.zeros((2, 3))}
  out = jax.jit(fn)(feats)
  # v=0: tanh(0) - 0 + 1.5 * exp(0)^2 = 1.5; v=2: tanh(1) + 0.5 * 1 = 1.261594
  np.testing.assert_allclose(out, [1.5, np.tanh(1.0) + 0.5], rtol=1e-6)


HOSTILE = {
    "import": "import os\ndef r(f):\n  return f['height']",
    "import_inside": "def r(f):\n  import os\n  return f['height']",
    "dunder_import": "def r(f):\n  return __import__('os').system('id') + f['height']",
    "builtins_open": "def r(f):\n  return open('/etc/passwd').read() + f['height']",
    "eval": "def r(f):\n  return eval('1') + f['height']",
    "getattr": "def r(f):\n  return getattr(jnp, 'sum')(f['height'])",
    "class_escape": "def r(f):\n  return ().__class__.__bases__[0].__subclasses__()",
    "feature_dunder": "def r(f):\n  return f['height'].__class__",
    "dict_methods": "def r(f):\n  return f.get('height')",
    "jnp_dunder": "def r(f):\n  return jnp.__dict__['sum'](f['height'])",
    "jnp_private": "def r(f):\n  return jnp._src(f['height'])",
    "jnp_io": "def r(f):\n  return jnp.load('/etc/passwd')",
    "jnp_alloc": "def r(f):\n  return jnp.zeros((100000, 100000)).sum() + f['height']",
    "newaxis_blowup": ("def r(f):\n  x = f['height']\n"
                       "  return jnp.sum(x[:, None] * x[None, :], axis=-1)"),
    "while_loop": "def r(f):\n  while True:\n    pass\n  return f['height']",
    "for_loop": "def r(f):\n  for i in f:\n    pass\n  return f['height']",
    "comprehension": "def r(f):\n  return jnp.stack([f[k] for k in f])",
    "lambda": "def r(f):\n  g = lambda x: x\n  return g(f['height'])",
    "if": "def r(f):\n  if f['height'] > 0:\n    return 1.0\n  return f['height']",
    "try": "def r(f):\n  try:\n    x = 1\n  except Exception:\n    x = 2\n  return f['height']",
    "with": "def r(f):\n  with f:\n    pass\n  return f['height']",
    "global": "def r(f):\n  global jnp\n  return f['height']",
    "attr_assign": "def r(f):\n  jnp.sum = None\n  return f['height']",
    "subscript_assign": "def r(f):\n  f['height'] = 1\n  return f['height']",
    "shadow_jnp": "def r(f):\n  jnp = 1\n  return f['height']",
    "private_name": "def r(f):\n  _x = 1\n  return f['height']",
    "unknown_feature": "def r(f):\n  return f['secret']",
    "dynamic_key": "def r(f):\n  k = 'height'\n  return f[k]",
    "string_const": "def r(f):\n  return f['height'] + 'a'",
    "fstring": "def r(f):\n  return f'{f}'",
    "two_functions": "def r(f):\n  return f['height']\ndef s(f):\n  return f['height']",
    "extra_statement": "x = 1\ndef r(f):\n  return f['height']",
    "decorator": "@jnp.vectorize\ndef r(f):\n  return f['height']",
    "default_arg": "def r(f, g=print):\n  return f['height']",
    "varargs": "def r(*f):\n  return f",
    "no_return": "def r(f):\n  x = f['height']",
    "starred_call": "def r(f):\n  return jnp.sum(*f['action'])",
    "kwargs_call": "def r(f):\n  return jnp.sum(f['action'], **{'axis': -1})",
    "bad_keyword": "def r(f):\n  return jnp.sum(f['action'], out=f['height'])",
    "walrus": "def r(f):\n  return (x := f['height'])",
    "yield": "def r(f):\n  yield f['height']\n  return f['height']",
    "async": "async def r(f):\n  return f['height']",
    "class": "class R:\n  pass",
    "syntax_error": "def r(f):\n  return (",
    "deep_nesting": "def r(f):\n  return " + "(" * 300 + "f['height']" + ")" * 300,
    "too_long": "def r(f):\n  return f['height']" + " + 1.0" * 2000,
    "nul": "def r(f):\n  return f['height']\x00",
    "ifexp": "def r(f):\n  return 1.0 if f['height'] else 0.0",
    "boolop": "def r(f):\n  return f['height'] and f['x_velocity']",
    "chained_compare": "def r(f):\n  return 0 < f['height'] < 1",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_rejects_outside_allow_list(name):
  with pytest.raises(mc.ModuleCodeError) as e:
    mc.validate_module_code(HOSTILE[name], FEATURES)
  assert str(e.value)  # Every rejection carries a reason for the feedback reflection.
  with pytest.raises(mc.ModuleCodeError):
    mc.compile_module(HOSTILE[name], FEATURES)  # And is never executed.


def test_module_names():
  assert mc.validate_name("upright_bonus") == "upright_bonus"
  for bad in ["Upright", "1abc", "a-b", "", "_x", "a" * 65, None]:
    with pytest.raises(mc.ModuleCodeError):
      mc.validate_name(bad)
