import dataclasses

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


def test_build_instantiates_a_registered_dataclass_and_names_its_knobs():
  reg = Registry("widget")

  @reg.register("box")
  @dataclasses.dataclass
  class Box:
    width: int = 1
    height: int = 2
    area: int = dataclasses.field(init=False, default=0)

  assert reg.build("box", height=5) == Box(1, 5)
  with pytest.raises(TypeError, match=r"widget 'box' has no knob\(s\) \['area', 'depth'\]; "
                                      r"valid knobs: width, height"):
    reg.build("box", depth=3, area=4)
  with pytest.raises(KeyError, match="unknown widget 'ball'"):
    reg.build("ball")
