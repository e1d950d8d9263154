"""`bertjax compile` of the ELECTRA recipes on the real TPU compiler (libtpu) for a slice this
machine does not have: the generator and the discriminator in one train step."""

import pytest

from bertjax.training import fit, tpu
from conftest import REPO

PRETRAIN = str(REPO / "experiments" / "pretrain.py")
needs_libtpu = pytest.mark.skipif(
    tpu.libtpu_missing() is not None, reason=tpu.libtpu_missing() or ""
)


@pytest.mark.slow
@needs_libtpu
def test_electra_small_fits_on_v5litepod_8_and_counts_the_generator():
  from bertjax.commands import pretrain

  argv = ["x", "--config", f"{PRETRAIN}:electra_small", "--config.model.vocab_size=30522"]
  fv = pretrain.define_flags(argv)
  fv(argv)
  config, _, _ = fit.resolve(fv.config)
  mesh, limit, _ = fit.setup_target(config, fit.Target(tpu.parse_accelerator("v5litepod-8")))
  [r] = fit.compile_phases(config, mesh, quick=True, keep_hlo=True)
  assert (r.batch, r.seq_len, r.mesh) == (128, 128, {"data": 8, "fsdp": 1, "tensor": 1})
  assert r.oom is None and 0 < r.peak < limit, r.peak
  # ELECTRA-Small's discriminator (13.5M parameters with its 128-wide embeddings) and its
  # 64-wide generator, in one state
  assert 13_000_000 < r.params < 20_000_000, r.params
  assert {c.op for c in r.collectives} >= {"all-reduce"}
  assert r.model_flops > 0
