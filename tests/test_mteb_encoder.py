"""`MTEBEncoder`: `mteb.evaluate` runs a bertjax encoder, scoring MTEB's own small local
retrieval task as it scores the same model through sentence-transformers; prompts are the
directory's, chosen by task and side."""

import numpy as np
import pytest

from test_embed import TEXTS, body, save_st  # noqa: F401  (the tiny sentence-transformers model)


@pytest.mark.slow  # two mteb evaluations end to end
def test_mteb_evaluate_runs_and_matches_sentence_transformers(body, tmp_path):  # noqa: F811
  import mteb
  from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask
  from mteb.types import PromptType

  from bertjax.tasks.mteb_encoder import MTEBEncoder

  st = save_st(body, tmp_path / "st", "mean", normalize=True)
  ours = MTEBEncoder(str(tmp_path / "st"), batch_rows=8)
  scores = [
      mteb.evaluate(m, [MockRetrievalTask()], cache=None, show_progress_bar=False)
      .task_results[0]
      .scores["test"][0]
      for m in (ours, st)
  ]
  for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "map_at_100"):
    assert scores[0][key] == pytest.approx(scores[1][key], abs=1e-6)

  task = MockRetrievalTask().metadata
  assert ours.prompt_for(task, PromptType.query) == "the query : "
  got = ours.encode(TEXTS, task_metadata=task, prompt_type=PromptType.query)
  want = st.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  batches = [{"text": TEXTS[:4]}, {"text": TEXTS[4:]}]  # MTEB 2's DataLoader batches
  np.testing.assert_allclose(ours.encode(batches), st.encode(TEXTS), atol=1e-4, rtol=0)
