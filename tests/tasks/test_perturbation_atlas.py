"""PertMind's synthetic atlas: §4.1 thresholds, BH, pathway proxies, splits, grammar, verifier."""

import json

import numpy as np
import pytest
import scipy.stats

from jaxrl_post.sampling import grammar
from jaxrl_post.tasks import get_task
from jaxrl_post.tasks import perturbation_atlas as pa
from jaxrl_post.tokenizers import CharTokenizer


@pytest.mark.parametrize("delta,q,mean,label", [
  (0.585, 0.05, 1.0, "Up"), (0.584, 0.01, 50, None), (-0.585, 0.05, 50, "Down"),
  (-2.0, 0.051, 50, None), (0.199, 0.5, 10.0, "No"), (-0.199, 0.9, 10.0, "No"),
  (0.2, 0.9, 50, None), (0.0, 0.49, 50, None), (0.0, 0.9, 9.99, None)])
def test_gene_labels_use_exactly_the_paper_thresholds(delta, q, mean, label):
  assert pa.gene_label(delta, q, mean) == label


def test_benjamini_hochberg_matches_scipy():
  p = np.random.default_rng(0).random(50) ** 3
  np.testing.assert_allclose(pa.benjamini_hochberg(p), scipy.stats.false_discovery_control(p))


def test_pathway_proxy_rule():
  up = pa.pathway_label(np.array([1.0, 0.9, 0.05, 0.8]), np.array([0.001, 0.01, 0.6, 0.02]))
  assert up == "Up"
  assert pa.pathway_label(np.array([-1.0, -0.8]), np.array([0.001, 0.01])) == "Down"
  assert pa.pathway_label(np.array([0.05, -0.1]), np.array([0.7, 0.9])) == "No"
  # Inconsistent active members: uncertain.
  assert pa.pathway_label(np.array([1.0, -1.0]), np.array([0.01, 0.01])) is None
  assert pa.pathway_label(np.array([]), np.array([])) is None


def test_task_splits_by_cell_line_and_excludes_the_gene_from_its_pathways():
  task = get_task("pertmind")
  train_lines = {json.loads(task.make_example("train", i)["meta"])["cell_line"]
                 for i in range(200)}
  test_lines = {json.loads(task.make_example("test", i)["meta"])["cell_line"] for i in range(60)}
  assert train_lines <= set(task.lines("train")) and test_lines <= {6, 7}
  assert not train_lines & test_lines
  labels = [task.make_example("train", i)["answer"] for i in range(30)]
  assert labels.count("Up") == labels.count("Down") == labels.count("No") == 10
  record = task.make_example("train", 5)
  meta = json.loads(record["meta"])
  atlas = task.atlas
  c, d, g = meta["cell_line"], meta["drug"], meta["gene"]
  assert pa.gene_label(atlas.delta[c, d, g], atlas.q[c, d, g], atlas.mean[c, d, g]) == \
    record["answer"]
  for p, label in zip(meta["pathways"], meta["pathway_labels"]):
    members = [m for m in atlas.pathways[p] if m != g]
    expect = pa.pathway_label(atlas.delta[c, d, members], atlas.q[c, d, members])
    assert label == (expect or "uncertain")
  # The prompt holds the query and knowledge, never the statistics or proxy labels.
  assert record["prompt"].startswith(f"c{c:02d} d{d:02d} g{g:03d} ")
  assert "Up" not in record["prompt"] and "Down" not in record["prompt"]
  assert task.reward(record, record["demonstration"]) == (1.0, 1.0)
  assert task.reward(record, "nonsense") == (0.0, 0.0)


def test_shuffled_control_permutes_the_pathway_labels_only():
  true, shuffled = get_task("pertmind"), get_task("pertmind", pathway_labels="shuffled")
  a = [json.loads(true.make_example("train", i)["meta"]) for i in range(300)]
  b = [json.loads(shuffled.make_example("train", i)["meta"]) for i in range(300)]
  assert [x["gene"] for x in a] == [x["gene"] for x in b]
  pa_, pb = (np.array([m["pathway_labels"] for m in x]) for x in (a, b))
  assert (pa_ == "uncertain").tolist() == (pb == "uncertain").tolist()
  assert np.mean(pa_[pa_ != "uncertain"] != pb[pb != "uncertain"]) > 0.3
  with pytest.raises(ValueError, match="task_knobs.pathway_labels"):
    get_task("pertmind", pathway_labels="random")


def test_demonstrations_follow_the_grammar():
  task = get_task("pertmind")
  tok = CharTokenizer()
  gram = grammar.from_slots(tok, task.grammar_slots())
  for i in range(20):
    demo = task.make_example("train", i)["demonstration"]
    assert grammar.accepts(gram, tok.encode(demo) + [tok.eos_id], [tok.eos_id])
