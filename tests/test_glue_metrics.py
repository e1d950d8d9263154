"""GLUE metrics against values worked out by hand (and against scipy where it is installed)."""

import math

import numpy as np
import pytest

from bertjax.tasks.glue import metrics, tasks


def test_accuracy_and_f1_by_hand():
  pred, gold = np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0])
  assert metrics.accuracy(pred, gold) == 0.5
  # tp = 2, fp = 1, fn = 1: precision = recall = 2/3.
  assert metrics.f1(pred, gold) == pytest.approx(2 / 3)
  assert metrics.f1(np.zeros(4, int), gold) == 0.0  # no positive predictions
  assert metrics.f1(np.array([0, 1]), np.array([0, 0])) == 0.0  # no positives at all


def test_mcc_by_hand():
  # tp = 2, tn = 2, fp = 1, fn = 1: (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3.
  assert metrics.mcc(np.array([1, 1, 0, 0, 1, 0]), np.array([1, 1, 0, 0, 0, 1])) == (
      pytest.approx(1 / 3)
  )
  # tp = 2, tn = 0, fp = 1, fn = 1: (0 - 1) / sqrt(3*3*1*1) = -1/3.
  assert metrics.mcc(np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0])) == pytest.approx(-1 / 3)
  # A constant predictor has an empty margin: MCC 0 (sklearn's convention), not NaN.
  assert metrics.mcc(np.ones(5, int), np.array([0, 1, 1, 0, 1])) == 0.0
  assert metrics.mcc(np.array([0, 2, 1, 2]), np.array([0, 2, 1, 2])) == pytest.approx(1.0)
  assert metrics.mcc(np.array([1, 0, 1, 0]), np.array([0, 1, 0, 1])) == pytest.approx(-1.0)


def test_mcc_multiclass_by_hand():
  # Confusion c[true, pred] = [[1, 1], [0, 2]] for classes 0/1 plus a third class row.
  gold = np.array([0, 0, 1, 1, 2])
  pred = np.array([0, 1, 1, 1, 2])
  # Gorodkin: c = 4 correct, s = 5, t = (2, 2, 1), p = (1, 3, 1).
  cov = 4 * 5 - (2 * 1 + 2 * 3 + 1 * 1)
  want = cov / math.sqrt((25 - (1 + 9 + 1)) * (25 - (4 + 4 + 1)))
  assert metrics.mcc(pred, gold) == pytest.approx(want)


def test_pearson_spearman_by_hand():
  # xc = (-1, 0, 1), yc = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9) = 15 / sqrt(228).
  assert metrics.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228))
  np.testing.assert_allclose(metrics.rankdata([10, 20, 20, 5]), [2, 3.5, 3.5, 1])
  # Ranks (1, 2.5, 2.5, 4) vs (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5) = sqrt(0.9).
  assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))
  assert metrics.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
  assert metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0  # constant input: defined as 0


def test_against_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(0)
  x = rng.normal(size=200)
  y = x + rng.normal(size=200)
  y_ties = np.round(y)  # many ties
  assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
  assert metrics.spearman(x, y_ties) == pytest.approx(stats.spearmanr(x, y_ties)[0], abs=1e-12)
  np.testing.assert_allclose(metrics.rankdata(y_ties), stats.rankdata(y_ties))


def test_compute_uses_each_tasks_metrics():
  pred, gold = np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0])
  mrpc = tasks.TASKS["mrpc"]
  assert metrics.compute(mrpc, mrpc.dev[0], pred, gold) == {
      "f1": pytest.approx(2 / 3),
      "accuracy": 0.5,
  }
  cola = tasks.TASKS["cola"]
  assert metrics.compute(cola, cola.dev[0], pred, gold)["mcc"] == pytest.approx(-1 / 3)
  mnli = tasks.TASKS["mnli"]
  m, mm = mnli.dev
  assert metrics.compute(mnli, m, np.array([0, 1, 2]), np.array([0, 1, 1])) == {
      "matched_accuracy": pytest.approx(2 / 3)
  }
  assert metrics.compute(mnli, mm, np.array([0, 1]), np.array([0, 1])) == {
      "mismatched_accuracy": 1.0
  }
  stsb = tasks.TASKS["stsb"]
  out = metrics.compute(stsb, stsb.dev[0], np.array([1.0, 2, 3]), np.array([2.0, 4, 7]))
  assert out["pearson"] == pytest.approx(15 / math.sqrt(228)) and out["spearman"] == 1.0


def test_majority_baseline():
  assert metrics.majority_baseline(np.array([1, 1, 0]), np.array([1, 0, 0, 0])) == 0.25
