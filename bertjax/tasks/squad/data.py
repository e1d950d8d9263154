"""SQuAD JSON files (v1.1 and v2.0) as a flat list of questions.

    examples, skipped = data.read("train-v2.0.json", version="2.0", training=True)

The layout is {"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}; "is_impossible" is v2.0 only;
`bertjax.schema`'s SQuAD models describe it. A malformed question is skipped, not
fatal: `skipped` says which (file, question id, why), as google-research/bert's run_squad warns
and skips answers it cannot find in the context. A file that is not SQuAD JSON down to the
questions raises `SquadDataError` naming the file and the path inside it.
"""

from __future__ import annotations

import dataclasses

from bertjax import errors, schema
from bertjax.runtime import fs

VERSIONS = ("1.1", "2.0")


class SquadDataError(errors.UserError, ValueError):
  """A file that is missing or not SQuAD JSON."""


@dataclasses.dataclass
class Example:
  qid: str
  question: str
  context: str
  answers: list[str]  # every gold answer text (dev sets have up to 5; [] = no answer)
  answer_start: int  # char offset of the first answer in context, the training target; -1 none
  is_impossible: bool  # v2.0: the paragraph does not answer the question

  @property
  def answer_text(self) -> str:
    return self.answers[0] if self.answers else ""


def read(
    path: str, version: str, training: bool, labelled: bool = True
) -> tuple[list[Example], list[str]]:
  """The questions of `path` and "file: question ID: why" for each one skipped.

  With `training`, each answerable question needs an answer whose `answer_start` points at its
  text in the context (that span is the target); for evaluation only the texts are needed;
  without `labelled` (a test set to predict) no answers are read.
  A file that is not SQuAD JSON down to the questions (`schema.SquadFile`) raises
  `SquadDataError` naming the file and the path inside it (`data[0].paragraphs`).
  """
  if version not in VERSIONS:
    raise errors.ConfigError(
        f"version {version!r} is not a SQuAD version — valid: {', '.join(VERSIONS)}"
    )
  name = fs.path(path).name
  squad = schema.read_squad(path, SquadDataError)
  examples, skipped, seen = [], [], set()
  for a, article in enumerate(squad.data):
    for p, para in enumerate(article.paragraphs):
      for q, raw in enumerate(para.qas):
        where = f"data[{a}].paragraphs[{p}].qas[{q}]"
        ex, why = _example(raw, para.context, version, training, labelled)
        if ex is not None and ex.qid in seen:
          ex, why = None, "duplicate id"
        if ex is None:
          qid = raw.get("id") if isinstance(raw, dict) else None
          qid = schema.printable(qid) if isinstance(qid, str) and qid else where
          skipped.append(f"{name}: question {qid}: {why}")
          continue
        seen.add(ex.qid)
        examples.append(ex)
  return examples, skipped


def _example(
    raw, context: str, version: str, training: bool, labelled: bool = True
) -> tuple[Example | None, str]:
  """One question, or None and why it is skipped."""
  if not isinstance(raw, dict):
    return None, f'expected an object {{"id", "question", "answers"}}, found {schema.found(raw)}'
  if not context.strip():
    return None, "its paragraph has no context text"
  qa, why = schema.squad_question(raw)
  if qa is None:
    return None, why
  if not qa.id:
    return None, 'no "id"'
  if not qa.question.strip():
    return None, 'no "question" text'
  if qa.is_impossible and version == "1.1":
    return None, "is_impossible is set, which v1.1 does not have (read the file as version 2.0)"
  if not labelled:
    return Example(qa.id, qa.question, context, [], -1, False), ""
  texts = [x.text for x in qa.answers]
  if qa.is_impossible:
    return Example(qa.id, qa.question, context, [], -1, True), ""
  if not texts:
    return None, "no answers (and not is_impossible)"
  start = qa.answers[0].answer_start
  if training:
    if not texts[0].strip():
      return None, "the first answer's text is empty"
    if start is None:
      return None, 'the first answer has no "answer_start"'
    if not 0 <= start < len(context):
      return None, f"answer_start {start} is outside the context ({len(context)} chars)"
    found = context[start : start + len(texts[0])]
    if found != texts[0]:
      return None, (
          f"answer_start {start} points at {schema.shown(found)}, not the answer "
          f"{schema.shown(texts[0])}"
      )
  return Example(qa.id, qa.question, context, texts, -1 if start is None else start, False), ""


def gold_answers(examples: list[Example]) -> dict[str, list[str]]:
  """qid -> gold answer texts, as the official scripts read them from the dataset."""
  return {ex.qid: list(ex.answers) for ex in examples}
