"""The model-family registry (tst_jax/models/__init__.py): every family meets FamilyConfig and
FamilyModel, and a family registered only here, a Llama whose MLP is GELU, trains a tiny
two-phase run end to end and is recorded as itself."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax import models, schema
from tst_jax.models import layers, llama
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import record as record_lib
from tst_jax.run import workdir as workdir_lib


@pytest.mark.parametrize("name", sorted(models.FAMILIES))
def test_every_family_meets_the_protocols(name):
  family = models.FAMILIES[name]
  preset = next(iter(family.presets))
  cfg = models.model_config(models.preset_config(name, preset))
  assert isinstance(cfg, models.FamilyConfig) and models.family_of(cfg) == name
  total, active = cfg.param_counts()
  assert 0 < active <= total and 0 < cfg.matmul_params() <= active
  assert cfg.flops_per_token(128) > 6 * cfg.matmul_params()   # attention on top of 6N
  model = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
  assert isinstance(model, family.model) and isinstance(model, models.FamilyModel)


class GeluMLP(nnx.Module):
  """A two-matrix GELU feed-forward: down(gelu(up(x)))."""

  def __init__(self, dim, ffw_dim, *, dtype, rngs, std):
    self.dtype = dtype
    self.up_proj = layers.param(rngs, (dim, ffw_dim), ("embed", "mlp"), std=std)
    self.down_proj = layers.param(rngs, (ffw_dim, dim), ("mlp", "embed"), std=std)

  def __call__(self, x_BxLxD):
    h = jax.nn.gelu(jnp.einsum("bld,df->blf", x_BxLxD, self.up_proj[...].astype(self.dtype)))
    return jnp.einsum("blf,fd->bld", h, self.down_proj[...].astype(self.dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GeluConfig(llama.LlamaConfig):
  """A Llama with a GELU MLP of two matrices instead of SwiGLU's three."""
  gelu_approximate: bool = schema.field(True, schema.BOOL, "tanh approximation of GELU")

  def build(self, rngs):
    return GeluLlama(self, rngs=rngs)

  def matmul_params(self):   # param_counts counts the built model's shapes: no change there
    return super().matmul_params() - self.n_layers * self.dim * self.ffw_dim


class GeluLlama(llama.Llama):
  def make_block(self, rngs):
    cfg = self.cfg
    return layers.Block(cfg.attention(), lambda r: GeluMLP(
        cfg.dim, cfg.ffw_dim, dtype=self.dtype, rngs=r, std=cfg.init_std), dtype=self.dtype,
                        rngs=rngs)


@pytest.fixture
def gelu_family():
  models.register("gelu_llama", models.Family(GeluConfig, GeluLlama, llama.PRESETS))
  yield
  models.unregister("gelu_llama")


def gelu_config(**fields):
  """tiny_config(**fields) with the GELU family's model of the same sizes."""
  config = tiny_config(**fields)
  config.model = models.preset_config("gelu_llama", "tiny", **{
      k: config.model[k] for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads",
                                   "ffw_dim")})
  return config


def test_a_family_registered_in_a_test_file_trains_a_short_run(tmp_path, gelu_family):
  """Four steps, two a phase, recorded as the family's."""
  summary = cli.run(gelu_config(steps=4, train=dict(checkpoint_every=0, eval_every=100)),
                    str(tmp_path))
  assert np.isfinite(summary["final_eval_loss"])
  assert type(record_lib.read_config(RunDir(tmp_path))["model"]) is GeluConfig   # read back


@pytest.mark.slow
def test_a_family_registered_in_a_test_file_trains_end_to_end(tmp_path, gelu_family):
  config = gelu_config()
  summary = cli.run(config, str(tmp_path))
  assert np.isfinite(summary["final_eval_loss"])
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  assert [r["phase"] for r in records if "loss" in r] == ["tst"] * 6 + ["ntp"] * 6
  with open(tmp_path / "config.json") as f:
    recorded = json.load(f)["model"]
  assert recorded["family"] == "gelu_llama" and recorded["gelu_approximate"] is True
  params = nnx.state(nnx.eval_shape(lambda: models.model_config(config.model).build(
      nnx.Rngs(0))), nnx.Param)
  assert "gate_proj" not in str(jax.tree_util.tree_structure(params))
  cfg = models.model_config(config.model)
  assert cfg.param_counts()[0] == sum(x.size for x in jax.tree.leaves(params))


def test_a_family_without_what_the_run_asks_is_refused():
  @dataclasses.dataclass(frozen=True)
  class Bare:
    dim: int = 8
  with pytest.raises(TypeError, match="build, param_counts, matmul_params, flops_per_token"):
    models.register("bare", models.Family(Bare, object, {}))
  assert "bare" not in models.FAMILIES
