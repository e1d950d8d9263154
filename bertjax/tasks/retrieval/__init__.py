"""Retrieval evaluation on BEIR-format data: `beir` reads the task, `search` ranks the corpus
for each query by the model's similarity (exact, in blocks), `metrics` scores the ranking as
trec_eval does."""
