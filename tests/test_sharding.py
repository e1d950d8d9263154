"""Mesh construction and the exact PartitionSpecs the logical-axis rules give the train state."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.bench import peers as bench_peers
from bertjax.training import sharding, train
from conftest import tiny_config


def test_make_mesh_fills_and_checks():
  assert dict(sharding.make_mesh(-1, 2, 1).shape) == {"data": 4, "fsdp": 2, "tensor": 1}
  assert dict(sharding.make_mesh(1, -1, 2).shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  assert dict(sharding.make_mesh(dcn_data=2).shape)["data"] == 8
  with pytest.raises(ValueError, match="3 do not divide|do not divide"):
    sharding.make_mesh(-1, 3, 1)
  with pytest.raises(ValueError, match="set one axis to -1"):
    sharding.make_mesh(2, 2, 1)


@pytest.mark.slow
def test_state_partition_specs_are_the_rules():
  mesh = sharding.make_mesh(2, 2, 2)
  s = train.setup(tiny_config(), mesh)
  spec = jax.tree.map(lambda x: x.spec, s.state_shardings.params)
  emb, layer = spec["bert"]["embeddings"], spec["bert"]["encoder"]["layer_0"]
  assert emb["word_embeddings"]["embedding"] == P("tensor", "fsdp")
  assert emb["position_embeddings"]["embedding"] == P(None, "fsdp")
  assert emb["token_type_embeddings"]["embedding"] == P(None, "fsdp")
  assert emb["layer_norm"]["scale"] == P("fsdp")
  assert layer["attention"]["qkv"]["kernel"] == P("fsdp", None, "tensor", None)
  assert layer["attention"]["qkv"]["bias"] == P(None, "tensor", None)
  assert layer["attention"]["out"]["kernel"] == P("tensor", None, "fsdp")
  assert layer["intermediate"]["kernel"] == P("fsdp", "tensor")
  assert layer["intermediate"]["bias"] == P("tensor")
  assert layer["output"]["kernel"] == P("tensor", "fsdp")
  assert spec["bert"]["pooler"]["kernel"] == P("fsdp", "tensor")
  assert spec["mlm_bias"] == P("tensor")
  assert spec["nsp"]["kernel"] == P("fsdp", None)
  # Adam moments are sharded exactly like their parameters; counters are replicated.
  adam = s.state_shardings.opt_state[1][0]
  assert adam.mu["bert"]["encoder"]["layer_0"]["output"]["kernel"].spec == P("tensor", "fsdp")
  assert adam.nu["mlm_bias"].spec == P("tensor")
  assert adam.count.spec == P()
  assert s.state_shardings.step.spec == P() and s.state_shardings.rng.spec == P()
  assert s.batch_sharding.spec == P(("data", "fsdp"))
  # The initialised state really is placed that way.
  state = s.init_state(0)
  assert state.params["mlm_bias"].sharding.spec == P("tensor")
  assert state.params["mlm_bias"].addressable_shards[0].data.shape == (500,)


def test_scanned_layers_keep_the_layer_axis_whole():
  c = tiny_config()
  c.model.scan_layers = True
  s = train.setup(c, sharding.make_mesh(1, 4, 2))
  layers = s.state_shardings.params["bert"]["encoder"]["layers"]
  assert layers["intermediate"]["kernel"].spec == P(None, "fsdp", "tensor")


def test_indivisible_dimension_is_replicated():
  mesh = sharding.make_mesh(1, 2, 4)
  assert sharding.logical_to_spec(("vocab", "embed"), (30522, 128), mesh) == P(None, "fsdp")
  assert sharding.logical_to_spec(("vocab", "embed"), (30520, 128), mesh) == P("tensor", "fsdp")


def test_batch_size_errors_name_the_field():
  mesh = sharding.make_mesh(4, 2, 1)
  with pytest.raises(ValueError, match=r"config.train.batch_size=12 .* multiple of 8"):
    sharding.check_batch_size(12, mesh)
  with pytest.raises(ValueError, match="microbatches"):
    sharding.check_batch_size(16, mesh, num_microbatches=3)
  sharding.check_batch_size(16, mesh, num_microbatches=2)


def _collectives(hlo: str) -> dict[str, int]:
  ops = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
  return {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in ops}
