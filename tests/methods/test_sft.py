"""methods/sft.py: the accuracy-band early stop (`config.stop_at_accuracy`)."""

import math

import pytest

from jaxrl_post.methods.sft import SFT
from jaxrl_post.training import base_configs


def _sft(target):
  config = base_configs.sft_base()
  config.stop_at_accuracy = target
  return SFT(config)


def test_stops_once_an_evaluation_reaches_the_target_and_the_state_keeps_it():
  method = _sft(0.7)
  assert math.isnan(method.last_accuracy) and not method.done(1)  # never evaluated
  method.last_accuracy = 0.69
  assert not method.done(2)
  method.last_accuracy = 0.70
  assert method.done(3)
  restarted = _sft(0.7)
  restarted.load_state_dict({"last_accuracy": method.last_accuracy})
  assert restarted.done(4)  # a resumed run stops as the uninterrupted one would


def test_off_by_default():
  method = _sft(base_configs.sft_base().stop_at_accuracy)
  method.last_accuracy = 1.0
  assert not method.done(1)


def test_no_evaluation_keeps_the_state_and_cannot_stop_on_accuracy():
  config = base_configs.sft_base()
  config.eval_examples = 0
  method = SFT(config)
  method.evaluator = lambda params, step: {}  # TaskEvaluator with no records
  assert method.evaluate(type("S", (), {"params": None})(), 5) == {}
  assert math.isnan(method.last_accuracy)
  config.stop_at_accuracy = 0.7
  with pytest.raises(ValueError, match="config.eval_examples must be >= 1"):
    SFT(config)
