"""Mistakes table rows (see test_mistakes.py) for the tools commands."""

from mistakes_common import Mistake

_TINY = ("--config", "{repo}/experiments/pretrain.py:tiny")


def _compile(id_: str, args: tuple[str, ...], *needles: str) -> Mistake:
  return Mistake(f"compile_{id_}", ("compile", *_TINY, *args), needles)


_COMPILE = [
    _compile("unknown_accelerator", ("--accelerator", "v3-8"), "--accelerator 'v3-8'", "v4-32"),
    _compile("odd_tensorcores", ("--accelerator", "v4-12"), "--accelerator 'v4-12'", "v4-32"),
    _compile(
        "accelerator_and_topology",
        ("--accelerator", "v4-32", "--topology", "v4:2x2x4"),
        "--accelerator and --topology",
        "pass one",
    ),
    _compile("bad_topology", ("--topology", "v4:2x2"), "--topology 'v4:2x2'", "3 dimensions"),
    _compile("mesh_zero", ("--mesh", "data=0,fsdp=-1"), "--mesh data=0,fsdp=-1", ">= 1"),
    _compile("mesh_not_integer", ("--mesh", "data=x"), "--mesh data=x", "not an integer"),
    _compile("mesh_unknown_axis", ("--mesh", "pipe=2"), "unknown axis 'pipe'", "fsdp"),
    _compile("mesh_dcn_axis", ("--mesh", "dcn_data=2"), "--config.mesh.dcn_data=N"),
    _compile(
        "devices_do_not_match_mesh",
        ("--mesh", "data=4,fsdp=2", "--devices", "6"),
        "--devices 6",
        "needs 8 devices",
    ),
    _compile("devices_zero", ("--devices", "0"), "--devices 0", ">= 1"),
    _compile(
        "devices_with_accelerator",
        ("--accelerator", "v4-32", "--devices", "8"),
        "--devices",
        "--accelerator",
    ),
    _compile(
        "mesh_does_not_fit_slice",
        ("--accelerator", "v4-32", "--mesh", "data=3,fsdp=1"),
        "--accelerator v4-32 (16 chips)",
        "needs 3 devices",
    ),
    _compile("phase_out_of_range", ("--phase", "3"), "--phase 3", "write 1"),
    _compile("phase2_of_one_phase", ("--phase", "2"), "--phase 2", "one phase"),
    _compile("suggest_without_target", ("--suggest",), "--suggest", "--accelerator"),
    _compile("memory_negative", ("--device-memory-gb", "-1"), "--device-memory-gb -1", "> 0"),
]


def _bench(id_: str, args: tuple[str, ...], *needles: str) -> Mistake:
  return Mistake(f"bench_{id_}", ("bench", *args), needles)


_BENCH = [
    _bench("unknown_preset", ("--preset", "huge"), "--preset 'huge'", "valid presets: tiny"),
    _bench("batch_size_zero", ("--batch-size", "0"), "--batch-size", ">= 1"),
    _bench("steps_negative", ("--steps", "-2"), "--steps", ">= 1"),
    _bench("seq_len_too_long", ("--seq-len", "1024"), "--seq-len 1024", "512"),
    _bench(
        "num_masked_too_many",
        ("--num-masked", "16", "--seq-len", "16"),
        "--num-masked 16",
        "--seq-len 16",
    ),
    _bench("unknown_peer", ("--compare", "hf-torch,tf"), "--compare tf", "hf-flax"),
    _bench("peak_flops_negative", ("--peak-flops", "-1"), "--peak-flops", ">= 0"),
    _bench("unknown_benchmark", ("inputs",), "invalid choice: 'inputs'", "input"),
    _bench("input_copies_zero", ("input", "--copies", "0"), "--copies", ">= 1"),
    _bench("input_missing_corpus", ("input", "--corpus", "nope.txt"), "--corpus nope.txt"),
    _bench("input_unknown_reader", ("input", "--readers", "arrow"), "--readers arrow", "tf.data"),
    _bench("input_not_prepared", ("input", "--data", "."), "--data .", "metadata.json"),
    _bench("input_json_dir_missing", ("input", "--json", "out/r.json"), "--json out/r.json"),
    _bench("finetune_unknown_peer", ("finetune", "--compare", "hf-flax"), "--compare hf-flax"),
    _bench("finetune_missing_task", ("finetune", "--task-dir", "nope"), "--task-dir nope"),
    _bench("finetune_epochs_zero", ("finetune", "--epochs", "0"), "--epochs", ">= 1"),
    _bench("finetune_seq_too_long", ("finetune", "--max-seq-len", "600"), "--max-seq-len 600"),
]

ROWS: list[Mistake] = [*_COMPILE, *_BENCH]
