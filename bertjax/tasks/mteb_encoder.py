"""A bertjax encoder as MTEB runs one: `mteb.evaluate(MTEBEncoder(INIT), tasks)`.

    import mteb
    from bertjax.tasks.mteb_encoder import MTEBEncoder

    model = MTEBEncoder("runs/base")            # or a sentence-transformers directory
    mteb.evaluate(model, mteb.get_tasks(tasks=["SciFact"]))

INIT is anything `bertjax embed --init` reads; texts are embedded by `bertjax.tasks.embed`
(packed rows, the directory's pooling, normalisation, length). Prompts are the directory's
`prompts`, chosen as sentence-transformers' MTEB wrapper chooses them (the task's name and
the query/document side, then the task type, then the side alone). `encode` takes MTEB 2's
batches of `{"text": [...]}` or, as MTEB 1 passed them, a list of strings.

Needs the `mteb` package (not a bertjax dependency: its tasks download their data).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from mteb.models import ModelMeta
from mteb.models.abs_encoder import AbsEncoder, get_prompt_name
from mteb.models.model_meta import ScoringFunction

from bertjax.tasks import embed as embed_lib
from bertjax.tasks import encoder as encoder_lib


class MTEBEncoder(AbsEncoder):
  """`encode(inputs, *, task_metadata, prompt_type, ...) -> np.ndarray` [N, D] float32."""

  def __init__(
      self,
      init: str,
      *,
      tokenizer: str | None = None,
      pooling: str | None = None,
      normalize: bool | None = None,
      max_seq_len: int | None = None,
      batch_rows: int = 32,
  ):
    self.enc = embed_lib.with_weights(encoder_lib.load_encoder(init, tokenizer))
    self.spec = embed_lib.spec_for(
        self.enc, pooling=pooling, normalize=normalize, max_seq_len=max_seq_len, prompt=""
    )
    self.batch_rows = batch_rows
    head = self.enc.sentence
    self.model_prompts = dict(head.prompts) if head else {}
    similarity = head.similarity if head else "cosine"
    self.mteb_model_meta = ModelMeta.create_empty(
        overwrites={
            "name": f"bertjax/{init.rstrip('/').rsplit('/', 1)[-1]}",
            "revision": "local",
            "similarity_fn_name": ScoringFunction(similarity),
            "max_tokens": self.spec.max_seq_len,
        }
    )

  def prompt_for(self, task_metadata, prompt_type) -> str:
    """The directory's prompt for this task and side ("" when it has none)."""
    if task_metadata is None or not self.model_prompts:
      return ""
    name = get_prompt_name(self.model_prompts, task_metadata, prompt_type)
    return self.model_prompts.get(name, "") if name else ""

  def encode(
      self,
      inputs,
      *,
      task_metadata=None,
      hf_split: str | None = None,
      hf_subset: str | None = None,
      prompt_type=None,
      **kwargs: Any,
  ) -> np.ndarray:
    del hf_split, hf_subset, kwargs  # batch_size and the like: packed rows are sized here
    texts = list(inputs) if _strings(inputs) else [t for b in inputs for t in b["text"]]
    spec = dataclasses.replace(self.spec, prompt=self.prompt_for(task_metadata, prompt_type))
    return embed_lib.embed(self.enc, texts, spec, batch_rows=self.batch_rows)


def _strings(inputs) -> bool:
  return isinstance(inputs, (list, tuple)) and all(isinstance(x, str) for x in inputs)
