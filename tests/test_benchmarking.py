"""`benchmarking.median_seconds`: what is timed and what is not."""

import time

from jaxrl_post.benchmarking import median_seconds


def test_setup_is_untimed_and_feeds_every_call_including_the_warm_up():
  made, seen = [], []

  def setup():
    time.sleep(0.05)  # would dominate the median if it were timed
    made.append(len(made))
    return made[-1]

  def fn(x):
    seen.append(x)
    time.sleep(0.005)

  seconds = median_seconds(fn, repeats=3, setup=setup)
  assert seen == made == [0, 1, 2, 3]  # warm-up + 3 timed calls, each on a fresh input
  assert 0.005 <= seconds < 0.05


def test_without_setup_fn_takes_no_argument():
  calls = []
  assert median_seconds(lambda: calls.append(1), repeats=2) >= 0
  assert len(calls) == 3
