"""`bertjax compile --accelerator h100-8`: the train step compiled for NVIDIA GPUs, no GPU here.

The compile tests need jax's CUDA plugin and cuDNN (the `gpu` extra); they skip without them.
`make test-gpu` installs the extra in a virtualenv of its own and runs this file (the plugin
would otherwise load into every JAX process of the suite). The name and error tests run
everywhere.
"""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from bertjax import cli, errors
from bertjax.commands import compile as compile_cmd
from bertjax.model import ops
from bertjax.training import gpu
from conftest import REPO

PRETRAIN = str(REPO / "experiments" / "pretrain.py")
TINY = [
    "--config",
    f"{PRETRAIN}:tiny",
    "--config.data.source=synthetic",
    "--config.model.vocab_size=1000",
    "--config.data.seq_len=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.train.batch_size=16",
]
# ModernBERT's network at tiny scale: a global layer, then two with a 32-token window.
MODERN_TINY = [
    "--config",
    f"{PRETRAIN}:modern_tiny",
    "--config.data.source=synthetic",
    "--config.model.vocab_size=1000",
    "--config.train.batch_size=16",
]
needs_plugin = pytest.mark.skipif(
    gpu.plugin_missing() is not None, reason=gpu.plugin_missing() or ""
)
needs_cudnn = pytest.mark.skipif(gpu.cudnn_missing() is not None, reason=gpu.cudnn_missing() or "")


def test_gpu_names_map_to_servers():
  s = gpu.parse_accelerator("h100-8")
  assert (s.chips, s.hosts, s.topology, s.model.kind) == (8, 1, "1x1x8", "NVIDIA H100 80GB HBM3")
  s = gpu.parse_accelerator("h100-8x4")  # 4 servers of 8
  assert (s.chips, s.hosts, s.topology) == (32, 4, "1x4x8")
  assert gpu.parse_accelerator("a100-2").topology == "1x1x2"
  assert gpu.parse_accelerator("h200-8").model.hbm_gb == 141
  assert gpu.is_gpu_name("h100-8x4") and gpu.is_gpu_name("b200-8")
  assert not any(gpu.is_gpu_name(n) for n in ("v4-32", "v5litepod-16", "v5e-8", "v6e-16"))


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--accelerator", "h100-3"], ["--accelerator 'h100-3'", "N = 1, 2, 4 or 8"]),
        (["--accelerator", "h100-4x2"], ["--accelerator 'h100-4x2'", "servers of 8"]),
        (["--accelerator", "b200-8"], ["--accelerator 'b200-8'", "a100, h100, h200"]),
        (
            ["--accelerator", "h100-8", "--mesh", "data=3,fsdp=1"],
            ["--accelerator h100-8 (8 GPUs)", "needs 3 devices, not 8"],
        ),
    ],
)
def test_gpu_mistakes_name_the_flag(argv, needles):
  with pytest.raises(errors.ConfigError) as e:
    compile_cmd.main(TINY + argv)
  for needle in needles:
    assert needle in str(e.value), str(e.value)


def test_without_the_plugin_the_command_says_so_in_one_line(monkeypatch, capsys):
  if gpu.plugin_missing() is None:  # installed here: hide it, as on a machine without the extra
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("jax_plugins") else find_spec(name, *a),
    )
  assert cli.main(["compile", *TINY, "--accelerator", "h100-8"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
      "bertjax compile: --accelerator h100-8: cannot compile for NVIDIA GPUs: jax's CUDA plugin "
      "is not installed: pip install -e '.[gpu]'"
  ], err


def test_target_descriptions_carry_the_model():
  text = gpu.target_config(gpu.MODELS["h100"])
  for needle in (
      "core_count: 132",
      "cuda_compute_capability { major: 9 minor: 0 feature_extension: ACCELERATED_FEATURES }",
      f"device_memory_size: {gpu.MODELS['h100'].hbm_bytes}",
      'device_description_str: "NVIDIA H100 80GB HBM3"',
  ):
    assert needle in text
  assert "major: 8 minor: 0" in gpu.target_config(gpu.MODELS["a100"])


def test_cudnn_takes_attention_only_where_jax_accepts_it():
  q = lambda length, d, dtype: jax.ShapeDtypeStruct((2, length, 4, d), dtype)  # noqa: E731
  assert ops.cudnn_refusal(q(128, 64, jnp.bfloat16), dropping=False) is None
  assert ops.cudnn_refusal(q(128, 64, jnp.float16), dropping=False) is None
  assert "attention_dropout_rate" in ops.cudnn_refusal(q(128, 64, jnp.bfloat16), dropping=True)
  assert "float32 compute" in ops.cudnn_refusal(q(128, 64, jnp.float32), dropping=False)
  assert "head dim 160" in ops.cudnn_refusal(q(128, 160, jnp.bfloat16), dropping=False)
  assert "length 127" in ops.cudnn_refusal(q(127, 64, jnp.bfloat16), dropping=False)


def test_usable_memory_follows_jax_allocator_share(monkeypatch):
  h100 = gpu.MODELS["h100"]
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  limit, src = gpu.usable_bytes(h100)
  assert limit == 0.75 * h100.hbm_bytes and "default" in src
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
  assert gpu.usable_bytes(h100)[0] == 0.9 * h100.hbm_bytes
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5")
  with pytest.raises(errors.ConfigError, match="XLA_PYTHON_CLIENT_MEM_FRACTION=1.5"):
    gpu.usable_bytes(h100)


# The shape of XLA's GPU output: the loop's trip count in its backend config (its condition
# compares inside a fusion), async collectives, cuDNN's attention as custom calls.
GPU_HLO = """HloModule m

%cond (p: (s32[])) -> pred[] {
  %p = (s32[]) parameter(0)
  ROOT %c = pred[] fusion(%p), kind=kLoop, calls=%fused_compare
}

%body (p: (s32[])) -> (s32[]) {
  %p = (s32[]) parameter(0)
  %f = bf16[8,128,4,64]{3,2,1,0} custom-call(%p), custom_call_target="__cudnn$fmhaSoftmax"
  %ar = bf16[1024]{0} all-reduce-start(%p), replica_groups={}, to_apply=%add
  ROOT %t = (s32[]) tuple(%p)
}

ENTRY %main (a: s32[]) -> s32[] {
  %w = (s32[]) while(%a), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %b = bf16[8,128,4,64]{3,2,1,0} custom-call(%a), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  ROOT %r = s32[] get-tuple-element(%w), index=0
}
"""


def test_gpu_hlo_counts_loops_by_their_known_trip_count():
  from bertjax.training import tpu

  got = [(c.op, c.dtype, c.shape, c.bytes, c.runs) for c in tpu.collectives(GPU_HLO)]
  assert got == [("all-reduce", "bf16", (1024,), 2048, 12)]
  calls = gpu.cudnn_attention_calls(GPU_HLO)
  assert calls == {"__cudnn$fmhaSoftmax": 12, "__cudnn$fmhaSoftmaxBackward": 1}
  plan = [("global", "cudnn", "mask (key padding) as cuDNN's bias")] * 12
  assert gpu.describe_attention(plan, calls, steps=1) == [
      "12 global layers: cuDNN flash attention, mask (key padding) as cuDNN's bias",
      "cuDNN calls per step: __cudnn$fmhaSoftmax 12, __cudnn$fmhaSoftmaxBackward 1",
  ]
  # Planned but absent from the program: JAX refused cuDNN while tracing, and says why.
  assert "XLA — JAX refused cuDNN while tracing" in gpu.describe_attention(plan, {}, 1)[0]


# ------------------------------------------------------------- the CUDA plugin's compiler


@needs_plugin
def test_compile_only_gpus_of_each_model():
  for name, count, hosts in (("a100-8", 8, 1), ("h100-8x2", 16, 2), ("h200-1", 1, 1)):
    s = gpu.parse_accelerator(name)
    devs = gpu.devices(s)
    assert len(devs) == count and {d.device_kind for d in devs} == {s.model.kind}, name
    assert {d.platform for d in devs} == {"gpu"}
    assert len({d.process_index for d in devs}) == hosts, name


@needs_plugin
def test_a_description_the_plugin_refuses_is_one_line(monkeypatch):
  # What a plugin whose proto lacks a field this module writes would answer.
  monkeypatch.setattr(gpu, "target_config", lambda model: "no_such_field: 1\n")
  with pytest.raises(errors.ConfigError) as e:
    compile_cmd.main(TINY + ["--accelerator", "h100-8"])
  msg = str(e.value)
  assert "h100-8: jax's CUDA plugin cannot build 8 compile-only NVIDIA H100 80GB HBM3" in msg
  assert "Failed to parse GpuTargetConfigProto" in msg and "\n" not in msg


@pytest.mark.slow
@needs_plugin
def test_bert_step_compiles_for_h100_servers_with_the_tpu_report(capsys):
  # Two servers of 8: data parallel over 16 GPUs; BERT's attention dropout keeps XLA's kernel.
  # Over the memory given: the report, one line on stderr and exit 1, as for a TPU slice.
  argv = TINY + ["--accelerator", "h100-8x2", "--device-memory-gb", "0.001"]
  assert compile_cmd.main(argv) == 1
  out, err = capsys.readouterr()
  assert "target h100-8x2: 16 x NVIDIA H100 80GB HBM3 (compute capability 9.0, 132 SMs)" in out
  assert "2 hosts x 8 GPUs; memory per GPU 0.00 GiB usable (--device-memory-gb)" in out
  assert "mesh {'data': 16, 'fsdp': 1, 'tensor': 1} on 16 x NVIDIA H100 80GB HBM3" in out
  assert "HBM per GPU: arguments" in out and "peak ~" in out
  assert "collectives: all-reduce" in out
  assert "attention: 2 global layers: XLA — attention dropout" in out
  assert (
      "DOES NOT FIT on h100-8x2: phase 1 needs " in err and "per GPU of 0.00 usable (80 GB" in err
  )


@pytest.mark.slow
@needs_plugin
@needs_cudnn
def test_cudnn_flash_attention_takes_packed_rows_and_local_windows(capsys):
  argv = MODERN_TINY + ["--config.model.dtype=bfloat16", "--config.data.packing=True"]
  assert compile_cmd.main(argv + ["--accelerator", "h100-8"]) == 0
  out = capsys.readouterr().out
  mask = "packed examples' segments"
  assert f"attention: 1 global layer: cuDNN flash attention, mask ({mask}) as cuDNN's bias" in out
  assert f"attention: 2 local 32 layers: cuDNN flash attention, mask ({mask} + window 32)" in out
  # Three layers, one forward and one backward call each (not scanned: ModernBERT's differ).
  assert (
      "cuDNN calls per step: __cudnn$fmhaScaleBiasSoftmax 3, "
      "__cudnn$fmhaScaleBiasSoftmaxBackward 3" in out
  )
