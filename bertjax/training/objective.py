"""The pretraining objective, behind one interface, chosen once from `config.objective`.

The train and eval steps, the loop, the checkpoint's record, the meter and the FLOPs count ask
the objective (`make(config, bert_config)`) rather than probing the model's type:

    obj = objective.make(config, bert_config)
    obj.model                         # the network trained (its "bert" subtree is the encoder)
    batch, draw = obj.prepare(batch, step_key)            # once per step, on the whole batch
    counts = obj.counts(batch)                            # whole-batch denominators
    sums, correct_BxP = obj.sums(params, mb, key, deterministic, draw)   # per (micro)batch
    sums, grads = obj.grad(params, mb, key, counts, draw)  # the train step's (micro)batch
    loss = obj.loss(sums, counts); metrics = obj.finalize(sums)

Sums, not means, so that accumulation and data parallelism give the whole batch's loss exactly
(`losses`). Implementations: `objective_mlm.MLM` (BERT's masked LM, with NSP or SOP),
`objective_electra.Electra` (replaced-token detection) and `objective_contrastive.Contrastive`
(the encoder as an embedding model, InfoNCE over the global batch; its own `grad` for the
GradCache step). Adding an objective is one new module
implementing `Objective` and one `elif` in `make` (docs/training.md, "Adding an objective").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from bertjax import errors

if TYPE_CHECKING:  # no jax at import: `config_checks` reads NAMES before jax loads
  import flax.linen as nn
  import jax

  from bertjax.model.config import BertConfig

  Array = jax.Array

NAMES = (
    "mlm",
    "electra",
    "contrastive",
)  # config.objective's valid values, each a branch of `make`


class Objective(Protocol):
  """What the training code asks of an objective."""

  name: str  # config.objective's value; recorded in the checkpoint
  bert_config: "BertConfig"  # the encoder that is kept (ELECTRA: the discriminator's)
  model: "nn.Module"  # the network trained; params["bert"] is the encoder every task reads
  sum_names: tuple[str, ...]  # the keys of `sums`, for accumulators

  def prepare(self, batch: dict, step_key: "Array") -> tuple[dict, Any]:
    """The step's batch (what the objective adds to it, e.g. each row's index) and its draw
    key (None for an objective that draws nothing)."""
    ...

  def counts(self, batch: dict) -> dict[str, "Array"]:
    """Denominators of the loss over the whole batch, taken before it is split."""
    ...

  def sums(
      self, params, batch: dict, dropout_key: "Array", deterministic: bool, draw: Any = None
  ) -> tuple[dict[str, "Array"], "Array"]:
    """Per-batch sums (`sum_names`) and [B, P] float32 correctness of the MLM predictions."""
    ...

  def loss(self, sums: dict[str, "Array"], counts: dict[str, "Array"]) -> "Array":
    ...

  def grad(
      self, params, batch: dict, dropout_key: "Array", counts: dict[str, "Array"], draw: Any = None
  ) -> tuple[dict[str, "Array"], Any]:
    """(sums, gradient of `loss` with respect to `params`) of a training (micro)batch; most
    objectives return `objective_mlm.grad_of_sums(self, ...)`."""
    ...

  def finalize(self, sums: dict[str, "Array"]) -> dict[str, "Array"]:
    """Means (loss, accuracies, perplexity) from summed `sums`."""
    ...

  def flops_per_step(self, batch_size: int, seq_len: int, max_predictions: int) -> float:
    """Model FLOPs (forward + backward) of one training step."""
    ...

  def record(self) -> dict:
    """What a checkpoint records of the objective (`objective`, `generator_config`)."""
    ...

  def trained_heads(self) -> tuple[str, ...]:
    """The heads (`train.HEAD_PARAMS`) a step of this objective trains."""
    ...

  def note(self) -> str:
    """What the run's model line adds for this objective ("" for none)."""
    ...

  # Whether heads that came trained from `--init` still fit the encoder once this objective
  # has trained it (MLM: yes; contrastive: no, its training leaves them stale).
  keeps_source_heads: bool

  def stream(self, config, phase, state: dict | None, split: str = "train"):
    """The batches of `phase` (`streams.mlm_stream`, `streams.pair_stream`), train or held
    out, resumed from `state`."""
    ...

  def evaluate(self, config, setup, params, phase, meta: dict | None) -> dict[str, float]:
    """Held-out metrics, `eval_` prefixed (`streams.mlm_evaluate`, ...)."""
    ...

  def has_eval_data(self, config, meta: dict | None, writer) -> bool:
    """Whether the prepared data holds held-out examples (else one warning line)."""
    ...


def name(config) -> str:
  """config.objective: "mlm" (BERT's masked LM, the default), "electra" or "contrastive"."""
  return config.objective or "mlm"


def make(config, bert_config: "BertConfig") -> Objective:
  """The objective `config.objective` names, on the encoder `bert_config`."""
  chosen = name(config)
  if chosen == "mlm":
    from bertjax.training import objective_mlm

    return objective_mlm.MLM(bert_config, config.data.pair_mode)
  elif chosen == "electra":
    from bertjax.training import objective_electra

    return objective_electra.Electra.from_config(config, bert_config)
  elif chosen == "contrastive":
    from bertjax.training import objective_contrastive

    return objective_contrastive.Contrastive.from_config(config, bert_config)
  raise errors.ConfigError(f"config.objective={chosen!r}: valid: {', '.join(NAMES)}")
