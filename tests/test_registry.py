import pytest

from jaxrl_post.registry import Registry


def test_register_get_and_errors():
  reg = Registry("widget")

  @reg.register("b")
  def b():
    return 2

  reg.add("a", 1)
  assert reg.get("a") == 1 and reg.get("b")() == 2
  assert reg.names() == ["a", "b"] and "a" in reg and list(reg) == ["a", "b"]
  with pytest.raises(KeyError, match="unknown widget 'c'; valid names: a, b"):
    reg.get("c")
  with pytest.raises(ValueError, match="widget 'a' is already registered"):
    reg.add("a", 3)
