"""SQuAD JSON files (v1.1 and v2.0) as a flat list of questions.

    examples, skipped = data.read("train-v2.0.json", version="2.0", training=True)

The layout is {"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}; "is_impossible" is v2.0 only.
A malformed question is skipped, not fatal: `skipped` says which (file, question id, why), as
google-research/bert's run_squad warns and skips answers it cannot find in the context. A file
that is not SQuAD JSON at all raises `SquadDataError` naming it.
"""

from __future__ import annotations

import dataclasses
import json

from bertjax import errors
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


def read(path: str, version: str, training: bool) -> tuple[list[Example], list[str]]:
  """The questions of `path` and "file: question ID: why" for each one skipped.

  With `training`, each answerable question needs an answer whose `answer_start` points at its
  text in the context (that span is the target); for evaluation only the texts are needed.
  """
  if version not in VERSIONS:
    raise errors.ConfigError(
        f"version {version!r} is not a SQuAD version — valid: {', '.join(VERSIONS)}"
    )
  name = fs.path(path).name
  articles = _load(path)
  examples, skipped, seen = [], [], set()
  for a, article in enumerate(articles):
    for p, para in enumerate(article.get("paragraphs", []) if isinstance(article, dict) else []):
      context = para.get("context") if isinstance(para, dict) else None
      qas = para.get("qas", []) if isinstance(para, dict) else []
      for q, qa in enumerate(qas):
        where = f"data[{a}].paragraphs[{p}].qas[{q}]"
        ex, why = _example(qa, context, version, training, where)
        if ex is not None and ex.qid in seen:
          ex, why = None, "duplicate id"
        if ex is None:
          qid = qa.get("id") if isinstance(qa, dict) and isinstance(qa.get("id"), str) else where
          skipped.append(f"{name}: question {qid}: {why}")
          continue
        seen.add(ex.qid)
        examples.append(ex)
  return examples, skipped


def _load(path: str) -> list:
  file = fs.path(path)
  if not file.is_file():
    raise SquadDataError(f"{path}: no such file")
  try:
    # As text mode reads it: strict UTF-8, line ends made "\n" (JSON errors count lines by it).
    text = file.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    blob = json.loads(text)
  except json.JSONDecodeError as e:
    raise SquadDataError(
        f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}) — expected a SQuAD "
        'file {"data": [{"paragraphs": [...]}]}'
    ) from None
  except UnicodeDecodeError as e:
    raise SquadDataError(f"{path}: not UTF-8 text (byte {e.start}) — expected SQuAD JSON") from None
  if not isinstance(blob, dict) or not isinstance(blob.get("data"), list):
    raise SquadDataError(
        f'{path}: field "data" is missing or not a list — expected a SQuAD file '
        '{"data": [{"paragraphs": [...]}]}'
    )
  return blob["data"]


def _example(qa, context, version: str, training: bool, where: str) -> tuple[Example | None, str]:
  """One question, or None and why it is skipped."""
  if not isinstance(qa, dict):
    return None, f"{where} is not an object"
  if not isinstance(context, str) or not context.strip():
    return None, "its paragraph has no context text"
  qid, question = qa.get("id"), qa.get("question")
  if not isinstance(qid, str) or not qid:
    return None, 'no "id"'
  if not isinstance(question, str) or not question.strip():
    return None, 'no "question" text'
  impossible = bool(qa.get("is_impossible", False))
  if impossible and version == "1.1":
    return None, "is_impossible is set, which v1.1 does not have (read the file as version 2.0)"
  answers = qa.get("answers", [])
  if not isinstance(answers, list) or not all(isinstance(x, dict) for x in answers):
    return None, '"answers" is not a list of {"text", "answer_start"}'
  texts = [x.get("text") for x in answers]
  if not all(isinstance(t, str) for t in texts):
    return None, "an answer has no text"
  if impossible:
    return Example(qid, question, context, [], -1, True), ""
  if not texts:
    return None, "no answers (and not is_impossible)"
  start = answers[0].get("answer_start")
  if training:
    if not texts[0].strip():
      return None, "the first answer's text is empty"
    if not isinstance(start, int) or not 0 <= start < len(context):
      return None, f"answer_start {start!r} is outside the context ({len(context)} chars)"
    found = context[start : start + len(texts[0])]
    if found != texts[0]:
      return None, f"answer_start {start} points at {found!r}, not the answer {texts[0]!r}"
  return Example(qid, question, context, texts, start if isinstance(start, int) else -1, False), ""


def gold_answers(examples: list[Example]) -> dict[str, list[str]]:
  """qid -> gold answer texts, as the official scripts read them from the dataset."""
  return {ex.qid: list(ex.answers) for ex in examples}
