"""The shared train state: shardings from the rules, created on them, steps traced under the rules
with explicit shardings and donation."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from bertjax.training import sharding, train_state


class _Tiny(nn.Module):
  """One named kernel [H=16, F=32] and one activation constraint."""

  @nn.compact
  def __call__(self, x_BxH):
    init = nn.with_logical_partitioning(nn.initializers.normal(), ("embed", "mlp"))
    kernel_HxF = self.param("kernel", init, (16, 32))
    h_BxF = nn.with_logical_constraint(x_BxH @ kernel_HxF, ("batch", "act_mlp"))
    return jnp.mean(h_BxF**2)


def _init_fn(model, tx, seed):
  key = jax.random.PRNGKey(seed)
  boxed = model.init(key, jnp.zeros((1, 16)))["params"]
  params = nn.unbox(boxed)
  state = train_state.TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=key
  )
  return boxed, state


def _step(state, x_BxH, *, model, tx):
  loss, grads = jax.value_and_grad(lambda p: model.apply({"params": p}, x_BxH))(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), loss


def _built(mesh):
  model, tx = _Tiny(), optax.adam(1e-2)
  return model, tx, train_state.build(functools.partial(_init_fn, model, tx), tx, mesh, 0)


def test_state_is_created_on_the_rules_shardings():
  mesh = sharding.make_mesh(1, 4, 2)
  _, _, built = _built(mesh)
  assert built.shardings.params["kernel"].spec == P("fsdp", "tensor")
  adam = built.shardings.opt_state[0]
  assert adam.mu["kernel"].spec == adam.nu["kernel"].spec == P("fsdp", "tensor")
  assert adam.count.spec == P() and built.shardings.step.spec == P()
  assert built.abstract.params["kernel"].sharding == built.shardings.params["kernel"]
  assert built.boxed["kernel"].names == ("embed", "mlp")
  state = built.init(jnp.asarray(0, jnp.uint32))
  kernel = state.params["kernel"]
  assert kernel.sharding.spec == P("fsdp", "tensor")
  assert kernel.addressable_shards[0].data.shape == (4, 16)  # really split 4 x 2 ways


def test_steps_are_traced_under_the_rules_and_donate_the_state():
  mesh = sharding.make_mesh(-1, 1, 1)
  model, tx, built = _built(mesh)
  batch_sh, repl = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  step_fn = functools.partial(_step, model=model, tx=tx)
  step = train_state.jit_step(
      step_fn,
      mesh,
      in_shardings=(built.shardings, batch_sh),
      out_shardings=(built.shardings, repl),
      donate_argnums=0,
  )
  x_BxH = jax.device_put(np.ones((8, 16), np.float32), batch_sh)
  state = built.init(jnp.asarray(0, jnp.uint32))
  # The model's activation constraint is in the traced step; outside the rules it is a no-op.
  assert "sharding_constraint" in step.lower(state, x_BxH).as_text()
  assert "sharding_constraint" not in jax.jit(step_fn).lower(state, x_BxH).as_text()
  new, loss = step(state, x_BxH)
  assert state.params["kernel"].is_deleted()  # donated: the new state reuses its buffers
  assert int(new.step) == 1 and np.isfinite(float(loss))
  assert new.params["kernel"].sharding == built.shardings.params["kernel"]
