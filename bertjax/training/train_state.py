"""The train state pretraining and fine-tuning share, created sharded, and their jitted steps.

    built = train_state.build(init_fn, tx, mesh, *example_args)
    state = built.init(*args)                 # created already sharded on the mesh
    step = train_state.jit_step(step_fn, mesh, in_shardings=(built.shardings, batch_sharding),
                                out_shardings=(built.shardings, replicated), donate_argnums=0)

`init_fn(*args) -> (boxed params, TrainState)`: besides the state, the parameters as the model
creates them, boxed with their logical axis names. `build` runs it abstractly
(`jax.eval_shape`), maps those names to shardings through `sharding.LOGICAL_AXIS_RULES` (each
optimizer-state leaf of a parameter's shape follows its parameter) and jits it with those
`out_shardings`, so BERT-large is never materialised on one device. `jit_step` jits a step with
explicit in/out shardings and donation and traces it under the mesh and the rules, so the
model's activation constraints take effect. This module imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax

from bertjax.training import sharding

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  step: Array  # int32 scalar: optimizer steps taken (pretraining's skipped non-finite ones too)
  params: Any  # unboxed model params, float32
  opt_state: Any  # optax state, float32 (fine-tuning's holds its peak learning rate)
  rng: Array  # dropout key; step keys are fold_in(rng, step)


@dataclasses.dataclass(frozen=True)
class ShardedState:
  """A train state's layout on a mesh and its jitted creation."""

  boxed: Any  # abstract params boxed with their logical axis names (`nn.Partitioned`)
  abstract: TrainState  # ShapeDtypeStructs carrying their shardings: restore targets
  shardings: TrainState  # NamedShardings, same structure
  init: Callable[..., TrainState]  # jitted `init_fn`, its output placed by `shardings`


def build(
    init_fn: Callable[..., tuple[Any, TrainState]],
    tx,
    mesh: jax.sharding.Mesh,
    *example_args,
) -> ShardedState:
  """`init_fn`'s state, shaped from `example_args` (values or ShapeDtypeStructs) without
  computing it, its shardings from the rules, and `init_fn` jitted to create it on them.

  The jitted init takes arguments placed by the caller (its in_shardings are theirs) and runs
  outside the rules: `out_shardings` alone places the state, where the rules would also split
  a dimension that the mesh does not divide (`sharding.logical_to_spec` replicates it).
  """
  boxed_abs, state_abs = jax.eval_shape(init_fn, *example_args)
  params_sh = sharding.state_shardings(boxed_abs, mesh)
  repl = sharding.replicated(mesh)
  shardings = TrainState(
      step=repl,
      params=params_sh,
      opt_state=sharding.opt_state_shardings(tx, state_abs.opt_state, params_sh, mesh),
      rng=repl,
  )
  init = jax.jit(lambda *args: init_fn(*args)[1], out_shardings=shardings)
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_abs, shardings
  )
  return ShardedState(boxed=boxed_abs, abstract=abstract, shardings=shardings, init=init)


@contextlib.contextmanager
def in_mesh(mesh: jax.sharding.Mesh):
  """The mesh and the logical-axis rules, as the model's constraints need them when traced."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
    yield


class InMesh:
  """A jitted step traced under the mesh and the logical-axis rules, so that the model's
  activation constraints (`nn.with_logical_constraint`) take effect; `.lower` for AOT."""

  def __init__(self, jitted, mesh: jax.sharding.Mesh):
    self.jitted, self.mesh = jitted, mesh

  def __call__(self, *args):
    with in_mesh(self.mesh):
      return self.jitted(*args)

  def lower(self, *args):
    with in_mesh(self.mesh):
      return self.jitted.lower(*args)


def jit_step(
    fn: Callable,
    mesh: jax.sharding.Mesh,
    *,
    in_shardings,
    out_shardings,
    donate_argnums: int | tuple[int, ...] = (),
) -> InMesh:
  """`fn` jitted with explicit shardings (donating `donate_argnums`: the old state, whose
  buffers the new one reuses) and traced under the mesh and the rules."""
  jitted = jax.jit(
      fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums
  )
  return InMesh(jitted, mesh)
