"""The fine-tuning recipe checks its own fields; its optimizer holds the peak learning rate."""

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import errors
from bertjax.tasks import recipe as recipe_lib
from bertjax.tasks.recipe import Recipe


@pytest.mark.parametrize(
    "field,value,must",
    [
        ("learning_rate", -1.0, "a finite number > 0"),
        ("learning_rate", 0.0, "a finite number > 0"),
        ("learning_rate", float("nan"), "a finite number > 0"),
        ("learning_rate", "3e-5", "a finite number > 0"),
        ("epochs", 0, "an integer >= 1"),
        ("epochs", 2.5, "an integer >= 1"),
        ("epochs", True, "an integer >= 1"),
        ("batch_size", 0, "an integer >= 1"),
        ("eval_batch_size", -8, "an integer >= 1"),
        ("warmup_fraction", 1.0, "a finite number in [0, 1)"),
        ("warmup_fraction", -0.1, "a finite number in [0, 1)"),
        ("weight_decay", -0.01, "a finite number >= 0"),
        ("dropout", 1.0, "a finite number in [0, 1)"),
        ("dropout", -0.1, "a finite number in [0, 1)"),
        ("clip_norm", float("inf"), "a finite number >= 0 (0: no clipping)"),
        ("seed", -1, "an integer >= 0"),
        ("max_steps", -1, "an integer >= 0 (0: no cap)"),
        ("length_bucket", -8, "an integer >= 0 (0: no buckets)"),
        ("max_lengths", -1, "an integer >= 0 (0: no cap)"),
    ],
)
def test_every_numeric_field_is_checked_and_named(field, value, must):
  want = f"^{re.escape(f'Recipe.{field}={value!r} must be {must}')}$"
  with pytest.raises(errors.ConfigError, match=want):
    Recipe(**{field: value})
  # however it is made: a sweep replaces fields of a valid recipe
  with pytest.raises(errors.ConfigError, match=want):
    dataclasses.replace(Recipe(), **{field: value})


@pytest.mark.parametrize("mesh", [(3,), (0, 1, 1), (-1, -1, 1), (2, -2, 1), "1,-1,1"])
def test_the_mesh_is_three_sizes_with_at_most_one_fill(mesh):
  with pytest.raises(errors.ConfigError, match=r"^Recipe.mesh=.* must be three integers"):
    Recipe(mesh=mesh)


def test_names_are_checked_against_the_valid_ones():
  with pytest.raises(errors.ConfigError, match=r"^Recipe.pooling='max'; valid: 'cls', 'mean'$"):
    Recipe(pooling="max")
  with pytest.raises(errors.ConfigError, match=r"^Recipe.optimizer='sgd'"):
    Recipe(optimizer="sgd")


def test_defaults_and_edges_are_valid():
  Recipe()
  Recipe(warmup_fraction=0.0, dropout=0.0, weight_decay=0.0, clip_norm=0.0, max_steps=0)
  Recipe(learning_rate=1, epochs=np.int64(2), mesh=(1, -1, 1))


def _update(recipe, grads, peak=None):
  tx = recipe_lib.make_optimizer(recipe, 10)
  params = {"kernel": jnp.zeros(3)}
  state = tx.init(params)
  if peak is not None:
    state = recipe_lib.with_peak_learning_rate(state, peak)
  updates, state = tx.update({"kernel": grads}, state, params)
  return np.asarray(updates["kernel"]), state


def test_the_peak_learning_rate_is_a_value_in_the_optimizer_state():
  base = Recipe(optimizer="adamw", weight_decay=0.0, warmup_fraction=0.0)
  g = jnp.array([0.1, -0.2, 0.3])
  one, _ = _update(base, g)
  assert np.all(one != 0)
  scaled, state = _update(base, g, peak=3e-4)
  np.testing.assert_allclose(scaled, 3e-4 * one, rtol=1e-6)
  assert float(recipe_lib.peak_learning_rate(state)) == pytest.approx(3e-4)  # kept by updates


def test_clip_norm_zero_means_no_clipping():
  """Adam is nearly blind to the gradient's scale, except through ε: clipping a large gradient
  to a tiny norm shows; clip_norm=0 updates as a clip that never triggers."""
  g = jnp.array([10.0, -20.0, 30.0])
  base = Recipe(optimizer="bert_adamw", weight_decay=0.0, warmup_fraction=0.0)
  never, _ = _update(dataclasses.replace(base, clip_norm=1e9), g)
  off, _ = _update(dataclasses.replace(base, clip_norm=0.0), g)
  tiny, _ = _update(dataclasses.replace(base, clip_norm=1e-4), g)
  np.testing.assert_array_equal(off, never)
  assert np.all(off != 0) and not np.allclose(tiny, never, rtol=1e-2)
