"""ELECTRA (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather
Than Generators"): replaced-token detection.

A small masked-language-model *generator* fills the masked positions with tokens sampled from
its output distribution; the *discriminator*, the encoder that is kept, reads the corrupted
sequence and says for every token whether it was replaced:

    x_masked ──> generator ──> p_G(x_t | x_masked) at the masked t ──> sample x̂_t
    x_corrupt = x with x̂_t at the masked t ──> discriminator ──> D(x_corrupt, t) for every t

    loss = L_MLM(generator) + λ · L_Disc,  λ = 50 (paper section 2, "disc_weight")

A sample equal to the original token counts as original (paper section 2). Sampling is at
temperature 1 and passes no gradient: the generator learns from its MLM loss only.

Both networks are `bert.BertModel`s and share the token, position and segment embeddings (and
their LayerNorm), which live in the discriminator ("bert/embeddings"); the generator is a
`BertModel` at a fraction of the width, the same depth, with no tables of its own and its own
`embeddings_project` from the embedding width E to its hidden size G. ELECTRA-Small's tables are
E = 128 wide and both encoders project them (to 256 and 64). Each block type works: the
generator takes the discriminator's switches (BERT's post-LN or the modern pre-LN, GeGLU, RoPE).

Parameters, so that "bert" is the encoder every task fine-tunes (as in `BertForPreTraining`):
  bert/                      the discriminator's encoder, with the shared embeddings
  discriminator_predictions  dense H -> H, activation, dense H -> 1 (one logit per token)
  generator/                 the generator's encoder (embeddings_project, layers)
  generator_predictions      dense G -> E, GELU, LayerNorm (E); then the tied decoder
  generator_bias             [V] the decoder's output bias

Shape letters: B batch, L length, H discriminator width, G generator width, E embedding width,
P masked positions, V vocabulary.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax.model import bert as bert_lib, layers
from bertjax.model.config import ACTIVATIONS, BertConfig

Array = jax.Array


def generator_config(disc: BertConfig, hidden_fraction: float) -> BertConfig:
  """The generator's config: `hidden_fraction` of the discriminator's width and MLP (ELECTRA's
  `generator_hidden_size`; 1/4 for Small, 1/3 for Base), the same depth and block, heads of
  the discriminator's head size (ELECTRA: hidden // 64), and the discriminator's embedding
  width, whose tables it shares."""
  hidden = int(round(disc.hidden_size * hidden_fraction))
  if hidden < 1:
    raise ValueError(
        f"generator_config: hidden_fraction={hidden_fraction} of hidden_size="
        f"{disc.hidden_size} leaves no width; valid: a fraction whose product is >= 1"
    )
  heads = max(1, hidden // disc.head_dim)
  if hidden % heads:
    heads = 1
  return disc.replace(
      hidden_size=hidden,
      num_heads=heads,
      intermediate_size=max(1, int(round(disc.intermediate_size * hidden_fraction))),
      embedding_size=disc.embedding_width,
  )


def sample_replacements(logits_BxPxV: Array, key: Array, row_ids_B: Array | None = None) -> Array:
  """[B, P] token ids drawn from softmax(logits) at temperature 1 (the Gumbel-max trick, as
  ELECTRA's `sample_from_softmax`); no gradient flows back through the draw.

  With `row_ids_B` (each row's index in the global batch) row b's noise is drawn from
  `fold_in(key, row_ids_B[b])`: the same draw whichever microbatch the row trains in.
  """
  logits_BxPxV = jax.lax.stop_gradient(logits_BxPxV.astype(jnp.float32))
  if row_ids_B is None:
    gumbel_BxPxV = jax.random.gumbel(key, logits_BxPxV.shape, jnp.float32)
  else:
    keys_B = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids_B)
    draw = lambda k: jax.random.gumbel(k, logits_BxPxV.shape[1:], jnp.float32)
    gumbel_BxPxV = jax.vmap(draw)(keys_B)
  return jnp.argmax(logits_BxPxV + gumbel_BxPxV, axis=-1).astype(jnp.int32)


def corrupt(
    input_ids_BxL: Array,
    masked_positions_BxP: Array,
    masked_ids_BxP: Array,
    masked_weights_BxP: Array,
    sampled_BxP: Array,
) -> tuple[Array, Array]:
  """(corrupted ids [B, L], is_replaced [B, L] float32): the input with each real masked
  position holding its sample, and where that sample differs from the original token.

  A one-hot over positions rather than a scatter: padded prediction slots (weight 0) point at
  position 0 and must write nothing, whatever order a scatter would apply them in.
  """
  length = input_ids_BxL.shape[1]
  real_BxP = masked_weights_BxP > 0
  at_BxPxL = (masked_positions_BxP[:, :, None] == jnp.arange(length)) & real_BxP[:, :, None]
  is_masked_BxL = jnp.any(at_BxPxL, axis=1)
  sampled_BxL = jnp.sum(jnp.where(at_BxPxL, sampled_BxP[:, :, None], 0), axis=1)
  original_BxL = jnp.sum(jnp.where(at_BxPxL, masked_ids_BxP[:, :, None], 0), axis=1)
  corrupted_BxL = jnp.where(is_masked_BxL, sampled_BxL, input_ids_BxL).astype(input_ids_BxL.dtype)
  is_replaced_BxL = is_masked_BxL & (sampled_BxL != original_BxL)
  return corrupted_BxL, is_replaced_BxL.astype(jnp.float32)


@flax.struct.dataclass
class GeneratorOutput:
  """What the generator's MLM loss needs (the decoder is fused with the loss, as
  `bert.PretrainingOutput`'s); `mlm_logits` forms the logits for sampling and inspection."""

  mlm_hidden: Array  # [B, P, E] generator_predictions at the masked positions
  mlm_table: Array  # [V, E] the shared word embeddings, compute dtype
  mlm_bias: Array  # [V] generator_bias

  @property
  def mlm_logits(self) -> Array:
    """[B, P, V] float32 logits of the tied decoder."""
    logits_BxPxV = jnp.dot(self.mlm_hidden, self.mlm_table.T, preferred_element_type=jnp.float32)
    return logits_BxPxV + self.mlm_bias.astype(jnp.float32)


@flax.struct.dataclass
class ElectraOutput:
  generator: GeneratorOutput
  sampled_ids: Array  # [B, P] the generator's samples at the masked positions
  corrupted_ids: Array  # [B, L] the discriminator's input
  is_replaced: Array  # [B, L] float32 labels: 1 where the sample differs from the original
  disc_logits: Array  # [B, L] float32, > 0: "replaced"


class DiscriminatorPredictions(nn.Module):
  """ELECTRA's discriminator head: dense H -> H, the activation, dense H -> 1."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, x_BxLxH: Array) -> Array:
    cfg = self.cfg
    h_BxLxH = bert_lib.dense(cfg, cfg.hidden_size, ("embed", "embed_out"), "dense")(x_BxLxH)
    h_BxLxH = ACTIVATIONS[cfg.hidden_act](h_BxLxH)
    logit_BxLx1 = bert_lib.dense(cfg, 1, ("embed", "classes"), "dense_prediction", True)(h_BxLxH)
    return logit_BxLx1[..., 0].astype(jnp.float32)


class GeneratorPredictions(nn.Module):
  """ELECTRA's generator head before the tied decoder: dense G -> E, GELU, LayerNorm."""

  cfg: BertConfig  # the generator's

  @nn.compact
  def __call__(self, x_BxPxG: Array) -> Array:
    cfg = self.cfg
    h_BxPxE = bert_lib.dense(cfg, cfg.embedding_width, ("embed", "embed_out"), "dense")(x_BxPxG)
    h_BxPxE = ACTIVATIONS["gelu"](h_BxPxE)  # ELECTRA's generator head: exact GELU, fixed
    return layers.layer_norm(cfg, "layer_norm")(h_BxPxE)


class ElectraForPreTraining(nn.Module):
  """The generator and the discriminator, trained together (see the module docstring).

  Called as `BertForPreTraining` is, on the masked batch; the draw needs an rng "sample"
  (`apply(..., rngs={"sample": key})`; `deterministic` governs dropout only).
  """

  cfg: BertConfig  # the discriminator's
  # None: the discriminator alone (a released `ElectraForPreTraining` directory holds no
  # generator): `discriminate` runs, `generate` and `__call__` refuse.
  generator_cfg: BertConfig | None

  def setup(self):
    self.bert = bert_lib.BertModel(self.cfg)  # the discriminator, and the shared embeddings
    self.discriminator_predictions = DiscriminatorPredictions(self.cfg)
    if self.generator_cfg is not None:
      self.generator = bert_lib.BertModel(self.generator_cfg)  # no tables of its own
      self.generator_predictions = GeneratorPredictions(self.generator_cfg)

  @nn.compact  # generator_bias is created here, so `discriminate` needs no generator params
  def generate(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None,
      attention_mask_BxL: Array | None,
      masked_positions_BxP: Array,
      *,
      segment_ids: Array | None = None,
      position_ids: Array | None = None,
      deterministic: bool = True,
  ) -> GeneratorOutput:
    """The generator on the masked input: its head at the masked positions."""
    if self.generator_cfg is None:
      raise ValueError(
          "ElectraForPreTraining(cfg, generator_cfg=None) is the discriminator alone: "
          "`generate` and training need the generator's config (electra.generator_config)"
      )
    generator_bias = self.param(
        "generator_bias", layers.zeros(("vocab",)), (self.cfg.vocab_size,), self.cfg.params_dtype
    )
    packed = dict(segment_ids=segment_ids, position_ids=position_ids)
    shared_BxLxE = self.bert.embed(
        input_ids_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic, **packed
    )
    enc = self.generator(
        input_ids_BxL,
        token_type_ids_BxL,
        attention_mask_BxL,
        segment_ids=segment_ids,
        position_ids=position_ids,
        deterministic=deterministic,
        embedded_BxLxE=shared_BxLxE,
        pool=False,
    )
    x_BxPxG = bert_lib.gather_positions(enc.sequence_output, masked_positions_BxP)
    h_BxPxE = self.generator_predictions(x_BxPxG)
    h_BxPxE = layers.constrain(h_BxPxE, ("batch", "masked", "act_embed"))
    table_VxE = self.bert.embeddings.word_embeddings.embedding.astype(h_BxPxE.dtype)
    return GeneratorOutput(mlm_hidden=h_BxPxE, mlm_table=table_VxE, mlm_bias=generator_bias)

  def discriminate(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      *,
      segment_ids: Array | None = None,
      position_ids: Array | None = None,
      deterministic: bool = True,
  ) -> Array:
    """[B, L] float32 logits that each token was replaced."""
    enc = self.bert(
        input_ids_BxL,
        token_type_ids_BxL,
        attention_mask_BxL,
        segment_ids=segment_ids,
        position_ids=position_ids,
        deterministic=deterministic,
        pool=False,
    )
    return self.discriminator_predictions(enc.sequence_output)

  def __call__(
      self,
      input_ids_BxL: Array,
      token_type_ids_BxL: Array | None = None,
      attention_mask_BxL: Array | None = None,
      masked_positions_BxP: Array | None = None,
      masked_ids_BxP: Array | None = None,
      masked_weights_BxP: Array | None = None,
      *,
      segment_ids: Array | None = None,
      position_ids: Array | None = None,
      cls_positions: Array | None = None,
      row_ids: Array | None = None,
      deterministic: bool = True,
  ) -> ElectraOutput:
    """`row_ids` [B]: each row's index in the global batch, which keys its draw
    (`sample_replacements`); gradient accumulation passes them."""
    del cls_positions  # no [CLS] head: every token is scored
    if masked_positions_BxP is None:  # init: two positions suffice to create every parameter
      masked_positions_BxP = jnp.zeros((input_ids_BxL.shape[0], 2), jnp.int32)
    if masked_ids_BxP is None:
      masked_ids_BxP = jnp.take_along_axis(input_ids_BxL, masked_positions_BxP, axis=1)
    if masked_weights_BxP is None:
      masked_weights_BxP = jnp.ones(masked_positions_BxP.shape, jnp.float32)
    packed = dict(segment_ids=segment_ids, position_ids=position_ids)
    gen = self.generate(
        input_ids_BxL,
        token_type_ids_BxL,
        attention_mask_BxL,
        masked_positions_BxP,
        deterministic=deterministic,
        **packed,
    )
    sampled_BxP = sample_replacements(gen.mlm_logits, self.make_rng("sample"), row_ids)
    corrupted_BxL, is_replaced_BxL = corrupt(
        input_ids_BxL, masked_positions_BxP, masked_ids_BxP, masked_weights_BxP, sampled_BxP
    )
    disc_logits_BxL = self.discriminate(
        corrupted_BxL, token_type_ids_BxL, attention_mask_BxL, deterministic=deterministic, **packed
    )
    return ElectraOutput(
        generator=gen,
        sampled_ids=sampled_BxP,
        corrupted_ids=corrupted_BxL,
        is_replaced=is_replaced_BxL,
        disc_logits=disc_logits_BxL,
    )
