"""`bertjax.training.fit` and `fit_suggest`: mesh arithmetic, CPU compiles, the variant search.

The TPU compiler's side (libtpu, real slices) is in test_compile.py; here the compiles are of the
tiny config on this process's 8 CPU devices, and the search runs on stand-in compile results so
that its skipping and ranking are checked exactly.
"""

import pytest

from bertjax import errors
from bertjax.training import fit, fit_suggest, tpu
from conftest import REPO

PRETRAIN = str(REPO / "experiments" / "pretrain.py")
SMALL = [
    "--config.data.source=synthetic",
    "--config.model.vocab_size=1000",
    "--config.data.seq_len=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.train.batch_size=16",
]


def _config(*overrides, variant="tiny"):
  from bertjax.commands import pretrain

  argv = ["x", "--config", f"{PRETRAIN}:{variant}", *overrides]
  fv = pretrain.define_flags(argv)
  fv(argv)
  return fv.config


# ------------------------------------------------------------------------------------ mesh


def test_mesh_devices_exact_or_a_multiple():
  assert fit.mesh_devices({"data": -1, "fsdp": 2, "tensor": 1}) == (2, True)
  assert fit.mesh_devices({"data": 4, "fsdp": 2, "tensor": 1, "dcn_data": 2}) == (16, False)
  assert fit.mesh_devices({}) == (1, False)
  assert fit.describe_mesh({"data": 4, "fsdp": 2, "dcn_data": 2}) == (
      "data=4,fsdp=2,tensor=1,dcn_data=2"
  )


@pytest.mark.parametrize(
    "mesh, needle",
    [
        ({"data": 0}, "config.mesh.data=0"),
        ({"fsdp": -2}, "config.mesh.fsdp=-2"),
        ({"data": -1, "fsdp": -1}, "at most one axis may be -1"),
        ({"dcn_fsdp": 0}, "config.mesh.dcn_fsdp=0"),
    ],
)
def test_mesh_devices_names_the_bad_field(mesh, needle):
  with pytest.raises(errors.ConfigError, match=needle):
    fit.mesh_devices(mesh)


# --------------------------------------------------------------------------------- compile


def test_setup_target_takes_the_first_devices_asked_for():
  config, _, _ = fit.resolve(_config(*SMALL), {"data": -1})
  mesh, limit, _ = fit.setup_target(config, fit.Target(num_devices=4))
  assert mesh.devices.size == 4 and limit is None
  _, limit, source = fit.setup_target(config, fit.Target(num_devices=2, memory_gb=0.5))
  assert (limit, source) == (0.5 * 2**30, "memory_gb")
  with pytest.raises(errors.ConfigError, match="Target.num_devices=99: this process has 8"):
    fit.setup_target(config, fit.Target(num_devices=99))


@pytest.mark.slow
def test_compile_phases_on_cpu_reports_memory():
  config, vocab, source = fit.resolve(_config(*SMALL), {"data": 8})
  assert (vocab, source) == (1000, "config.model.vocab_size")
  mesh, _, _ = fit.setup_target(config, fit.Target(num_devices=8))
  (r,) = fit.compile_phases(config, mesh, phase=0)
  assert (r.index, r.batch, r.seq_len, r.mesh) == (0, 16, 32, {"data": 8, "fsdp": 1, "tensor": 1})
  assert set(r.memory) == {"arguments", "outputs", "donated", "temporaries", "code"}
  assert r.peak > 0 and r.oom is None and r.model_flops > 0
  assert not fit.does_not_fit(r, None) and fit.does_not_fit(r, 1.0)


def test_a_batch_that_does_not_split_names_the_field():
  config, _, _ = fit.resolve(_config(*SMALL, "--config.train.batch_size=12"), {"data": 8})
  mesh, _, _ = fit.setup_target(config, fit.Target(num_devices=8))
  with pytest.raises(errors.ConfigError, match="config.train.batch_size=12"):
    fit.compile_phases(config, mesh)


def test_fix_hint_cheapest_first():
  config = _config(*SMALL)
  r = fit.PhaseResult(0, 16, 32, 1, 100, {"data": 4, "fsdp": 1, "tensor": 1})
  assert fit.fix_hint(config, r, 4) == (
      "config.model.remat=full, config.mesh.fsdp=4, config.train.microbatches=4"
  )
  with config.unlocked():
    config.model.remat = "full"
  r = fit.PhaseResult(1, 6, 512, 1, 100, {"data": 1, "fsdp": 4, "tensor": 1})
  assert fit.fix_hint(config, r, 4) == "a larger slice"
  # The contrastive step splits its batch into GradCache chunks, never into microbatches
  # (they would split the negatives).
  with config.unlocked():
    config.objective = "contrastive"
  r = fit.PhaseResult(0, 256, 128, 1, 100, {"data": 4, "fsdp": 4, "tensor": 1})
  assert fit.fix_hint(config, r, 4) == "config.contrastive.chunk_size=64"
  with config.unlocked():
    config.contrastive.chunk_size = 32
  assert fit.fix_hint(config, r, 4) == "config.contrastive.chunk_size=8"


# --------------------------------------------------------------------------------- suggest

GIB = 2**30


def _stand_in_compiles(monkeypatch):
  """Memory and estimates by rule instead of compiles: fsdp 1 without remat needs 20 GiB
  (over the 16 GiB limit), remat halves it, 4 microbatches halve it; fsdp 4 needs 8 GiB."""
  compiled = []

  def compile_phases(c, mesh, quick=False, phase=None, keep_hlo=False):
    fsdp, remat, micro = c.mesh.fsdp, c.model.remat, c.train.microbatches
    peak = 8 * GIB if fsdp == 4 else 20 * GIB / (2 if remat == "full" else 1) / (micro // 2 or 1)
    est = {(4, "none", 1): 2e-3, (1, "full", 1): 3e-3, (1, "none", 4): 4e-3}.get(
        (fsdp, remat, micro), 1e-3
    )
    compiled.append((fsdp, remat, micro))
    r = fit.PhaseResult(0, 16, 32, micro, 100, {"data": 4 // fsdp, "fsdp": fsdp, "tensor": 1})
    r.peak, r.estimate_s, r.bound_s = peak, est, 1e-4
    return [r]

  monkeypatch.setattr(fit, "compile_phases", compile_phases)
  monkeypatch.setattr(fit, "setup_target", lambda c, t: (None, 16 * GIB, "stand-in"))
  return compiled


def test_suggest_skips_slower_variants_and_ranks_by_estimate(monkeypatch, capsys):
  compiled = _stand_in_compiles(monkeypatch)
  target = fit.Target(tpu.parse_accelerator("v5litepod-4"))
  assert fit_suggest.suggest(_config(*SMALL), target, phase=0) == 0
  # fsdp 1: none/1 too big, full/1 fits, none/4 fits, full/4 skipped; fsdp 4: none/1 fits and
  # the three with more remat or microbatches are skipped.
  assert compiled == [(1, "none", 1), (1, "full", 1), (1, "none", 4), (4, "none", 1)]
  out = capsys.readouterr().out
  assert "  does not fit (20.0 GiB per chip, phase 1 / 2): " in out
  ranked = [l for l in out.splitlines() if l.startswith("  est ")]
  assert [l.split(" ms")[0] for l in ranked] == [
      "  est 2.0 (>= 0.1)",
      "  est 3.0 (>= 0.1)",
      "  est 4.0 (>= 0.1)",
  ]
  assert "--config.mesh.fsdp=4" in ranked[0] and "--config.model.remat=full" in ranked[1]
  assert "(4 variants with more remat or microbatches" in out


def test_suggest_exit_1_when_nothing_fits(monkeypatch, capsys):
  _stand_in_compiles(monkeypatch)
  target = fit.Target(tpu.parse_accelerator("v5litepod-4"), memory_gb=1.0)
  monkeypatch.setattr(fit, "setup_target", lambda c, t: (None, GIB, "stand-in"))
  assert fit_suggest.suggest(_config(*SMALL), target, phase=0) == 1
  assert "DOES NOT FIT on v5litepod-4 in any variant tried" in capsys.readouterr().err
  with pytest.raises(errors.ConfigError, match="TPU slice"):
    fit_suggest.suggest(_config(*SMALL), fit.Target(), phase=0)


def test_variants_cover_both_meshes():
  got = [(f, r, m) for f, r, m, _ in fit_suggest.variants(4)]
  assert got[:4] == [(1, "none", 1), (1, "full", 1), (1, "none", 4), (1, "full", 4)]
  assert len(got) == 8 and {f for f, _, _ in got} == {1, 4}
  assert len(list(fit_suggest.variants(1))) == 4  # one chip: one mesh
