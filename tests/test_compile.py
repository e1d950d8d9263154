"""`bertjax compile`: the train step compiles ahead of time for a mesh and reports memory.

The TPU tests run the real TPU compiler (libtpu, the `tpu` extra, which `make test` installs)
for slices this machine does not have. Compiles are the cost (30-90 s each on 2 cores), so each
recipe is compiled once per phase for one slice, at the quick effort, and shared by the tests
(measured on a shared 2-core machine: base 62 s, large 126 s, the too-big case 8 s at load
average ~4; 113 s, 225 s and 15 s at ~7.6).
"""

import os
import subprocess
import sys

import pytest

from bertjax import errors
from bertjax.commands import compile as compile_cmd
from bertjax.training import fit, tpu
from conftest import REPO

ARGS = [
    "--config",
    str(REPO / "experiments" / "pretrain.py") + ":tiny",
    "--config.data.source=synthetic",
    "--config.model.vocab_size=1000",
    "--config.data.seq_len=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.train.batch_size=16",
]
PRETRAIN = str(REPO / "experiments" / "pretrain.py")
needs_libtpu = pytest.mark.skipif(
    tpu.libtpu_missing() is not None, reason=tpu.libtpu_missing() or ""
)


@pytest.mark.slow
def test_compile_reports_memory_and_fails_when_too_big(capsys):
  assert compile_cmd.main(ARGS + ["--mesh", "data=1,fsdp=4,tensor=2", "--devices", "8"]) == 0
  out = capsys.readouterr().out
  assert "vocab 1,000 (config.model.vocab_size)" in out
  assert "mesh {'data': 1, 'fsdp': 4, 'tensor': 2} on 8 x cpu" in out
  assert "per device:" in out and "peak ~" in out
  rc = compile_cmd.main(ARGS + ["--mesh", "data=8,fsdp=1", "--device-memory-gb", "0.0001"])
  assert rc == 1
  assert "DOES NOT FIT on this device: phase 1 needs " in capsys.readouterr().err
  # the older spelling still works
  rc = compile_cmd.main(ARGS + ["--phase", "1", "--devices", "8", "--device_memory_gb", "0.0001"])
  assert rc == 1


@pytest.mark.slow
def test_compile_uses_the_devices_asked_for(capsys):
  # This process started JAX with 8 devices: --devices 4 compiles for the first 4 of them.
  assert compile_cmd.main(ARGS + ["--mesh", "data=2,fsdp=2", "--devices", "4", "--phase", "1"]) == 0
  assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 1} on 4 x cpu" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, kind, needles",
    [
        (["--accelerator", "v3-8"], errors.ConfigError, ["--accelerator 'v3-8'", "v5litepod-16"]),
        (["--accelerator", "v4-32", "--topology", "v4:2x2x4"], errors.UsageError, ["pass one"]),
        (["--topology", "v4:2x2"], errors.ConfigError, ["--topology 'v4:2x2'", "3 dimensions"]),
        (["--mesh", "data=0"], errors.ConfigError, ["--mesh data=0", ">= 1"]),
        (["--mesh", "dcn_data=2"], errors.ConfigError, ["--config.mesh.dcn_data=N"]),
        (
            ["--mesh", "data=4,fsdp=2", "--devices", "6"],
            errors.ConfigError,
            ["--devices 6", "data=4,fsdp=2,tensor=1 needs 8 devices"],
        ),
        (["--mesh", "tensor=3"], errors.ConfigError, ["default --devices 8", "multiple of 3"]),
        (
            ["--accelerator", "v4-32", "--mesh", "data=3,fsdp=1"],
            errors.ConfigError,
            ["--accelerator v4-32 (16 chips)", "needs 3 devices, not 16"],
        ),
        (["--accelerator", "v4-32", "--devices", "16"], errors.UsageError, ["drop --devices"]),
        (["--devices", "0"], errors.ConfigError, ["--devices 0", ">= 1"]),
        (["--phase", "3"], errors.ConfigError, ["--phase 3", "write 1"]),
        (["--phase", "2", "--config.phase2.fraction=0"], errors.ConfigError, ["one phase"]),
        (["--suggest"], errors.UsageError, ["--suggest needs a TPU target"]),
        (["--device-memory-gb", "-2"], errors.ConfigError, ["--device-memory-gb -2", "> 0"]),
    ],
)
def test_mistakes_raise_user_errors_naming_the_flag(argv, kind, needles):
  with pytest.raises(kind) as e:
    compile_cmd.main(ARGS + argv)
  for needle in needles:
    assert needle in str(e.value), str(e.value)


def test_the_command_leaves_the_process_environment_as_it_found_it(capsys):
  # XLA_FLAGS and the compile cache switch are set for the command only: a later command or
  # subprocess of this process (a test, a sweep) must not inherit a device count or a
  # disabled cache from it.
  keys = ("XLA_FLAGS", "JAX_ENABLE_COMPILATION_CACHE")
  before = {k: os.environ.get(k) for k in keys}
  assert compile_cmd.main(ARGS + ["--mesh", "data=2,fsdp=2", "--devices", "4", "--phase", "1"]) == 0
  with pytest.raises(errors.ConfigError):
    compile_cmd.main(ARGS + ["--accelerator", "v4-32", "--mesh", "data=3,fsdp=1"])
  assert {k: os.environ.get(k) for k in keys} == before


def _config(variant, *overrides):
  from bertjax.commands import pretrain

  argv = ["x", "--config", f"{PRETRAIN}:{variant}", *overrides]
  fv = pretrain.define_flags(argv)
  fv(argv)
  return fv.config


def test_vocab_comes_from_the_data_or_is_stated(tmp_path):
  # What `pretrain` would use: the bundled tokenizer without config.data.path ...
  vocab, source = fit.resolve_vocab(_config("tiny"))
  assert vocab == 8000 and source.startswith("the bundled tokenizer")
  # ... a prepared directory's metadata.json, or BERT's, said so, when it cannot be read.
  vocab, source = fit.resolve_vocab(_config("base", f"--config.data.path={tmp_path}"))
  assert vocab == 30522 and source.startswith("assumed (BERT's)")
  assert "set config.model.vocab_size" in source


def test_accelerator_types_map_to_slices():
  s = tpu.parse_accelerator("v4-32")  # TensorCores: 16 chips, 4 hosts
  assert (s.topology, s.chips, s.hosts) == ("v4:2x2x4", 16, 4)
  s = tpu.parse_accelerator("v5p-8")
  assert (s.topology, s.chips, s.hosts) == ("v5p:2x2x1", 4, 1)
  s = tpu.parse_accelerator("v5litepod-16")  # chips
  assert (s.topology, s.chips, s.hosts) == ("v5e:4x4", 16, 4)
  assert tpu.parse_accelerator("v6e-8").hosts == 1  # single-host 8-chip slice
  assert tpu.parse_accelerator("v5p-768").topology == "v5p:4x8x12"
  with pytest.raises(errors.ConfigError, match="accelerator 'v4-12'.*TensorCores"):
    tpu.parse_accelerator("v4-12")
  with pytest.raises(errors.ConfigError, match="accelerator 'v3-8'.*v5litepod-16"):
    tpu.parse_accelerator("v3-8")
  with pytest.raises(errors.ConfigError, match="--accelerator 'v5e-3'.*one of 1, 4, 8"):
    tpu.parse_accelerator("v5e-3", what="--accelerator")


def test_topologies_map_to_slices():
  s = tpu.parse_topology("v5e:4x4")
  assert (s.topology, s.chips, s.hosts) == ("v5e:4x4", 16, 4)
  assert tpu.parse_topology("v4:2x2x2").chips == 8
  with pytest.raises(errors.ConfigError, match="topology 'v4:2x2'.*3D torus"):
    tpu.parse_topology("v4:2x2")
  with pytest.raises(errors.ConfigError, match="topology 'v4:0x2x2'"):
    tpu.parse_topology("v4:0x2x2")
  with pytest.raises(errors.ConfigError, match="GENERATION:DIMS"):
    tpu.parse_topology("4x4")


HLO = """\
HloModule m

%body (p: (s32[], bf16[8,4])) -> (s32[], bf16[8,4]) {
  %ag = bf16[8,4]{1,0} all-gather(bf16[2,4]{1,0} %x), dimensions={0}
  ROOT %t = (s32[], bf16[8,4]) tuple(%i, %ag)
}

%cond (p: (s32[], bf16[8,4])) -> pred[] {
  %c = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[16]) -> f32[16] {
  %w = (s32[], bf16[8,4]) while(%init), condition=%cond, body=%body
  %ars = (f32[16]{0}, f32[16]{0}) all-reduce-start(f32[16]{0} %a), to_apply=%add
  ROOT %rs = f32[4]{0} reduce-scatter(f32[16]{0} %a), dimensions={0}
}
"""


def test_collectives_counted_with_loop_trip_counts():
  got = {(c.op, c.dtype, c.shape, c.runs) for c in tpu.collectives(HLO)}
  assert got == {
      ("all-gather", "bf16", (8, 4), 12),
      ("all-reduce", "f32", (16,), 1),
      ("reduce-scatter", "f32", (4,), 1),
  }


def test_pallas_kernels_counted_with_loop_trip_counts():
  kernel = '  %splash_mha_fwd_residuals.2 = (f32[8]) custom-call(%x), custom_call_target="tpu_custom_call"'
  hlo = HLO.replace("  ROOT %t = ", kernel + "\n  ROOT %t = ")  # inside the 12-trip loop
  hlo = hlo.replace("  ROOT %rs = ", kernel.replace(".2 ", ".7 ") + "\n  ROOT %rs = ")
  assert tpu.pallas_kernels(hlo) == {"splash_mha_fwd_residuals": 13}
  assert tpu.pallas_kernels(HLO) == {}


# ------------------------------------------------------------------ the real TPU compiler


@needs_libtpu
def test_libtpu_devices_and_hbm_per_chip():
  """v4/v5p chips are one megacore device each; the compiler's usable HBM per chip."""
  got = {}
  for name in ("v4-32", "v5litepod-16", "v5p-8", "v6e-16"):
    s = tpu.parse_accelerator(name)
    devs = tpu.devices(s)
    assert len(devs) == s.chips, name
    assert len({d.process_index for d in devs}) == s.hosts, name
    assert devs[0].num_cores == s.generation.cores_per_chip, name
    hbm, src = tpu.usable_hbm_bytes(devs[0], s.generation.hbm_gib)
    assert src == "the TPU compiler's limit"
    got[name] = round(hbm / 2**30, 2)
  assert got == {"v4-32": 30.75, "v5litepod-16": 15.75, "v5p-8": 95.74, "v6e-16": 31.25}


def _compile(variant, accelerator, *overrides):
  c = _config(variant, "--config.model.vocab_size=30522", *overrides)
  config, _, _ = fit.resolve(c)
  mesh, limit, _ = fit.setup_target(config, fit.Target(tpu.parse_accelerator(accelerator)))
  return fit.compile_phases(config, mesh, quick=True, keep_hlo=True), limit


@pytest.fixture(scope="module")
def base_v4_32():
  """BERT-base, the recipe's mesh (data parallel over all 16 chips), both phases."""
  return _compile("base", "v4-32")


@pytest.fixture(scope="module")
def large_v6e_16():
  """BERT-large, FSDP over all 16 chips, both phases."""
  return _compile("large", "v6e-16", "--config.mesh.data=1", "--config.mesh.fsdp=16")


@pytest.mark.long
@pytest.mark.slow
@needs_libtpu
def test_base_fits_on_v4_32_both_phases(base_v4_32):
  rs, limit = base_v4_32
  assert [(r.index, r.batch, r.seq_len) for r in rs] == [(0, 256, 128), (1, 256, 512)]
  for r in rs:
    assert r.mesh == {"data": 16, "fsdp": 1, "tensor": 1}
    assert r.oom is None and 0 < r.peak < limit, (r.index, r.peak)
    assert r.estimate_s and r.estimate_s > 0  # the compiler's estimate, at quick effort
    ops = {c.op for c in r.collectives}
    # Data parallel: gradients are all-reduced; the replicated state is never gathered.
    assert "all-reduce" in ops and not r.windowed
    assert not [c for c in r.collectives if c.op == "all-gather" and c.dtype in ("f32", "bf16")]


@pytest.mark.long
@pytest.mark.slow
@needs_libtpu
def test_large_fits_on_v6e_16_with_fsdp_and_its_collectives(large_v6e_16):
  rs, limit = large_v6e_16
  assert [(r.index, r.seq_len) for r in rs] == [(0, 128), (1, 512)]
  for r in rs:
    assert r.mesh == {"data": 1, "fsdp": 16, "tensor": 1}
    assert r.oom is None and 0 < r.peak < limit, (r.index, r.peak)
    # FSDP: parameters all-gathered (the compiler fuses most into their matmuls), gradients
    # reduce-scattered, both once per layer of the scan.
    assert r.windowed.get("ag") and r.windowed.get("rs"), r.windowed
    floats = [c for c in r.collectives if c.dtype in ("f32", "bf16")]
    gathers = [c for c in floats if c.op == "all-gather"]
    assert gathers and all(c.runs <= 24 for c in gathers)
    # The word embeddings are gathered whole (bf16), once per step.
    assert [c.runs for c in gathers if c.shape == (30522, 1024)] == [1]
    # No per-token activation is gathered: nothing of batch x seq; the one batch-sized float
    # gather is the [CLS] rows (B x H) for the pooler's weight gradient.
    tokens = r.batch * r.seq_len
    assert not [
        c
        for c in gathers
        if (r.batch in c.shape and r.seq_len in c.shape) or (c.shape and c.shape[0] % tokens == 0)
    ], [c.shape for c in gathers]
    assert [c.shape for c in gathers if r.batch in c.shape] == [(r.batch, 1024)]


@pytest.mark.slow
@needs_libtpu
def test_too_big_is_one_line_and_exit_1():
  p = subprocess.run(
      [
          sys.executable,
          "-m",
          "bertjax.cli",
          "compile",
          "--config",
          f"{PRETRAIN}:large",
          "--config.model.vocab_size=30522",
          "--accelerator",
          "v5litepod-4",
          "--phase",
          "1",
          "--quick",
      ],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=600,
  )
  assert p.returncode == 1, p.stderr[-2000:]
  assert "Traceback" not in p.stderr + p.stdout
  lines = [l for l in p.stderr.splitlines() if "DOES NOT FIT" in l]
  assert len(lines) == 1, p.stderr[-2000:]
  assert lines[0].startswith("DOES NOT FIT on v5litepod-4: phase 1 needs ")
  assert (
      "per chip of 15.75 usable (16 GiB HBM); try config.model.remat=full, "
      "config.mesh.fsdp=4" in lines[0]
  )


# ---------------------------------------------------------- the modern recipe on the TPU compiler


def _compile_phase(variant, accelerator, phase, *overrides):
  c = _config(variant, "--config.model.vocab_size=50368", *overrides)  # ModernBERT's vocabulary
  config, _, _ = fit.resolve(c)
  mesh, limit, _ = fit.setup_target(config, fit.Target(tpu.parse_accelerator(accelerator)))
  [r] = fit.compile_phases(config, mesh, quick=True, phase=phase, keep_hlo=True)
  return r, limit


def _splash_calls(r) -> tuple[int, int]:
  """(forward, backward) splash attention kernel calls per step."""
  fwd = sum(n for k, n in r.kernels.items() if k.startswith("splash_mha_fwd"))
  bwd = sum(n for k, n in r.kernels.items() if k.startswith("splash_mha_d"))
  return fwd, bwd


@pytest.mark.long
@pytest.mark.slow
@needs_libtpu
def test_modern_base_fits_on_v5p_32_at_seq_1024_with_splash_attention():
  """ModernBERT-base, the recipe's phase 1 (batch 256 x seq 1,024, data parallel over 16 v5p
  chips): every one of the 22 layers' attention, local and global, is the Pallas kernel."""
  r, limit = _compile_phase("modern_base", "v5p-32", 0)
  assert (r.batch, r.seq_len, r.mesh) == (256, 1024, {"data": 16, "fsdp": 1, "tensor": 1})
  assert r.oom is None and 0 < r.peak < limit, r.peak
  assert _splash_calls(r) == (22, 44), r.kernels  # forward; dq and dkv of the backward pass
  assert {c.op for c in r.collectives} == {"all-reduce"}  # data parallel: gradients only


@pytest.mark.long
@pytest.mark.slow
@needs_libtpu
def test_modern_network_at_seq_8192_compiles_with_local_splash_windows():
  """The recipe's phase 2 (seq 8,192, ModernBERT's context extension) cut to its first four
  layers (global, local, local, global) on a v5p-8: the long sequence runs through the kernel
  with its 128-token windows. The full 22 layers' figures are in docs/performance.md."""
  r, limit = _compile_phase("modern_base", "v5p-8", 1, "--config.model.num_layers=4")
  assert (r.batch, r.seq_len) == (32, 8192)
  assert r.oom is None and 0 < r.peak < limit, r.peak
  assert _splash_calls(r) == (4, 8), r.kernels
  # without the kernel XLA's attention would hold [B/4, 12, 8192, 8192] f32 scores per layer:
  # 24 GiB per chip for one layer's forward alone
  assert r.memory["temporaries"] < 24 * 2**30, r.memory
