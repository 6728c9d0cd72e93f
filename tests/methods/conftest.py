"""Stand-ins the method tests share."""

import pytest


class LoaderPosition:
  """The sharded loader's iterator as a method's `state_dict` sees it: only its position."""

  def __init__(self):
    self.state = {"next_index": 0}

  def get_state(self):
    return dict(self.state)

  def set_state(self, state):
    self.state = dict(state)


@pytest.fixture
def loader_position():
  """A factory of `LoaderPosition`s (a round-trip test needs two)."""
  return LoaderPosition
