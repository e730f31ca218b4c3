"""How a keras_vit model executes here: the device kind, the precision, and XLA or TensorFlow's
graph runtime.

- The device: `device_kind()` ("cpu" or "gpu"), `on_cpu()`, `cpu_flags()` (the CPU's features).
- The precision: one table, `PRECISIONS`, from the precision names ("float32", "bfloat16",
  "float16") to the Keras dtype policies that compute in them; `policy_name(precision)` and
  `precision_of(policy)` read it in each direction. `keras_vit.training.set_precision` and
  `keras_vit.export_saved_model(precision=)` take these names.
- The runtime: `choose` is the default wherever a user does not choose: `keras_vit.training.fit`
  and the recipes (training), the command line, `keras_vit.export_saved_model` (inference). It
  reads the measured table `TABLE`: the first row that matches the device, the CPU's features,
  the precision and the mode decides. `jit_compile=`, `--xla` and `--no-xla` override it; the
  JAX backend always compiles with XLA. `model.compile()` without `jit_compile` keeps Keras'
  own "auto" (XLA on a GPU, the graph runtime on a CPU), which agrees with this table wherever
  the CPU has AVX-512.

The table's rows come from `python -m benchmarks.run` (BENCHMARKS.md, a section per machine):
each says which runtime was faster there for a precision and a mode, ViT-B/16, batch 8.
"""

import dataclasses

import keras

from keras_vit import framework
from keras_vit.checks import check_choice
from keras_vit.devices import cpu_flags, device_kind

# Precision name -> the Keras dtype policy that computes in it (float32 weights and logits under
# the mixed policies).
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
_PRECISION_OF_POLICY = {policy: precision for precision, policy in PRECISIONS.items()}


@dataclasses.dataclass(frozen=True)
class Row:
    """A row of the measured table: where it applies, what it chooses, and why."""

    device: str  # "cpu" or "gpu" (a GPU or TPU)
    cpu_flag: object  # a /proc/cpuinfo flag the CPU must have, or None
    precisions: tuple  # the precisions it covers ("float32", "bfloat16", "float16")
    xla: bool
    why: str


ALL = ("float32", "bfloat16", "float16")
TABLE = (
    Row("gpu", None, ALL, True,
        "an accelerator: XLA, Keras' own choice there (TensorFlow on a GPU was not measured "
        "here)"),
    Row("cpu", "amx_tile", ALL, False,
        "a CPU with AMX: the graph runtime runs oneDNN's AMX kernels, XLA's CPU backend has "
        "none (bfloat16 under XLA ran slower than float32)"),
    Row("cpu", "avx512f", ALL, False,
        "a CPU with AVX-512: the graph runtime's oneDNN kernels matched or beat XLA in "
        "float32, with a shorter start-up, and ran bfloat16 1.7x faster"),
    Row("cpu", None, ALL, True,
        "a CPU with AVX2 and no AVX-512: XLA was faster than the graph runtime"),
)


def policy_name(precision, precisions=tuple(PRECISIONS)):
    """The Keras dtype policy name that computes in `precision` ("float32", "bfloat16",
    "float16").

    Args:
        precision: str. A precision name.
        precisions: the names the caller accepts (a subset of `PRECISIONS`). Defaults to all.

    Raises:
        ValueError: for a name not in `precisions`.
    """
    return PRECISIONS[check_choice("precision", precision, tuple(precisions))]


def precision_of(policy=None):
    """The precision name of a Keras dtype policy or policy name (default: the global one);
    "float32" for a policy outside `PRECISIONS` (an int8 or float64 one)."""
    name = policy.name if hasattr(policy, "name") else policy or keras.config.dtype_policy().name
    return _PRECISION_OF_POLICY.get(name, "float32")


def table_row(precision, device=None, flags=None):
    """The first row of `TABLE` that matches."""
    device = device or device_kind()
    flags = cpu_flags() if flags is None else flags
    for row in TABLE:
        if row.device == device and (row.cpu_flag is None or row.cpu_flag in flags) \
                and precision in row.precisions:
            return row
    raise ValueError(f"No runtime row for device {device!r} and precision {precision!r}.")


def choose(policy=None, strategy=None):
    """`(jit_compile, reason)`: whether to compile with XLA here, and why.

    Args:
        policy: the model's Keras dtype policy (or its name); default: the global one.
        strategy: the `tf.distribute` strategy the model runs under, or None.
    """
    if keras.backend.backend() == "jax":
        return True, "the JAX backend compiles every step with XLA"
    if framework.op_determinism_enabled():
        return False, "TensorFlow's op determinism is on (Keras does not combine it with XLA)"
    import tensorflow as tf  # the TensorFlow backend's strategies, on that backend only

    if isinstance(strategy, tf.distribute.TPUStrategy):
        return True, "a TPU runs XLA"
    if strategy is not None and strategy.num_replicas_in_sync > 1:
        return False, (f"{strategy.num_replicas_in_sync} replicas: Keras' XLA step reads the "
                       "other replicas' variables across devices (MirroredStrategy), and "
                       "XLA has no CPU collectives (MultiWorkerMirroredStrategy)")
    row = table_row(precision_of(policy))
    return row.xla, row.why
