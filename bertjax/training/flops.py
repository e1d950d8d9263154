"""Model FLOPs of one BERT pretraining step, and device peaks, for MFU.

MFU = model FLOPs per step / (step time * devices * peak FLOP/s of one device). "Model" FLOPs
count the matmuls of forward + backward (x3 of forward) and not the recomputation that remat
adds, so MFU compares fairly across remat settings (Chowdhery et al. 2022, appendix B).
"""

from __future__ import annotations

import jax

# bf16 dense peak FLOP/s per device (per chip for TPUs), from the vendors' data sheets.
PEAK_FLOPS: dict[str, float] = {
    "TPU v2": 45e12 / 2,  # per core
    "TPU v3": 123e12 / 2,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5e": 197e12,
    "TPU v5": 459e12,  # v5p
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e (Trillium)
    "TPU v6e": 918e12,
    "NVIDIA H200": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
}


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
  """The bf16 peak of `device` (default: the first), or None when unknown (e.g. CPU)."""
  kind = (device or jax.devices()[0]).device_kind
  # Longest matching prefix, so "TPU v5 lite" is not read as "TPU v5".
  for name in sorted(PEAK_FLOPS, key=len, reverse=True):
    if kind.startswith(name):
      return PEAK_FLOPS[name]
  return None


def non_embedding_params(cfg) -> int:
  """Parameters of the encoder layers (and ELECTRA's `embeddings_project`, E -> H, a matmul
  every token goes through): everything except lookup tables."""
  h, f, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  glu, bias = cfg.mlp_type == "glu", cfg.use_bias
  attention = 4 * h * h + (4 * h if bias else 0)
  mlp = (3 if glu else 2) * h * f + ((2 * f if glu else f) + h if bias else 0)  # GLU: W_in is 2F
  e = cfg.embedding_size or h
  project = e * h if e != h else 0
  return n * (attention + mlp + (4 * h if bias else 2 * h)) + project  # and 2 LayerNorms


def attended_keys(cfg, seq_len: int) -> int:
  """Keys each query attends to, summed over the layers: all `seq_len` in a global layer, the
  window (|i - j| <= local_attention // 2) in a local one."""
  window, every = cfg.local_attention, cfg.global_every
  local = min(seq_len, window + 1) if window else seq_len
  return sum(seq_len if i % every == 0 else local for i in range(cfg.num_layers))


def pretraining_flops_per_step(
    cfg, batch_size: int, seq_len: int, max_predictions: int, generator=None
) -> float:
  """Training FLOPs (forward + backward) of one step of `BertForPreTraining`, or with
  `generator` (its config) of `ElectraForPreTraining` (`electra_flops_per_step`).

  6 x encoder params x tokens, plus attention scores and mixing (12 * L * H * T per token:
  QK^T and AV, 2 matmuls x 2 FLOPs x 3 for the backward; T the keys a query sees, the window
  in local layers), plus the MLM head on the gathered
  positions only (transform H x H, then the tied decoder H x V) and the pooler + NSP head.
  """
  if generator is not None:
    return electra_flops_per_step(cfg, generator, batch_size, seq_len, max_predictions)
  h, v = cfg.hidden_size, cfg.vocab_size
  e = cfg.embedding_size or h
  tokens = batch_size * seq_len
  mlm_head = 6 * (h * e + e * v) * batch_size * max_predictions
  nsp_head = 6 * (h * h + 2 * h) * batch_size
  return float(encoder_flops(cfg, tokens, seq_len) + mlm_head + nsp_head)


def encoder_flops(cfg, tokens: int, seq_len: int) -> int:
  """Forward + backward FLOPs of one encoder over `tokens` tokens in rows of `seq_len`: 6 x
  its parameters x tokens plus the attention scores and mixing."""
  encoder = 6 * non_embedding_params(cfg) * tokens
  return encoder + 12 * cfg.hidden_size * attended_keys(cfg, seq_len) * tokens


def electra_flops_per_step(disc, gen, batch_size: int, seq_len: int, max_predictions: int) -> float:
  """Training FLOPs of one ELECTRA step (Clark et al. 2020): the generator's encoder over every
  token and its head at the masked positions (dense G -> E, the tied decoder E x V), the draw
  (the decoder once more, forward only, and the softmax's ~4 FLOPs per logit: exp, sum,
  Gumbel noise, argmax), then the discriminator's encoder and its head (dense H x H, H x 1)
  over every token. A step of each objective can then be compared by model FLOPs."""
  v, e = disc.vocab_size, disc.embedding_size or disc.hidden_size
  tokens, predictions = batch_size * seq_len, batch_size * max_predictions
  generator = encoder_flops(gen, tokens, seq_len)
  generator_head = 6 * (gen.hidden_size * e + e * v) * predictions
  sampling = (2 * e * v + 4 * v) * predictions
  discriminator = encoder_flops(disc, tokens, seq_len)
  disc_head = 6 * (disc.hidden_size * disc.hidden_size + disc.hidden_size) * tokens
  return float(generator + generator_head + sampling + discriminator + disc_head)
