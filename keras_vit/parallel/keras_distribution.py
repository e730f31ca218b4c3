"""`keras.distribution` for keras_vit: data parallelism, and model parallelism that shards the
attention heads and MLP units of every encoder block (the JAX backend's way to train a model
larger than one accelerator).

```python
distribution = keras_vit.get_distribution("L/16", model_parallel=4)   # 8 devices: 2 x 4 mesh
keras.distribution.set_distribution(distribution)                      # before building
model = keras_vit.ViT_L16(num_classes=10)
keras_vit.training.fit(model, train, output_dir="runs/l16")
```

The split is Megatron-LM's (Shoeybi et al., 2019): in each block the query, key and value
kernels are sharded by heads and the output projection by its input heads, the first MLP
kernel by its output units and the second by its input units, so that each block needs one
all-reduce after attention and one after the MLP. Everything else (embeddings, LayerNorms,
biases added after a reduction, the head, a hybrid's ResNet) is replicated. The variables'
paths are the checkpoint's names (`encoderblock_3/MlpBlock_3/Dense_0/kernel`), so the same map
serves every variant, and the optimizer's variables follow the weights they belong to.
"""

import os

import keras

from keras_vit.configs import get_variant
from keras_vit.devices import data_parallel_size  # noqa: F401 - importable here too
from keras_vit.model_parts import VIT_DEFAULTS, vit_config
from keras_vit.checks import (
    check_choice,
    check_divisible,
    check_positive_int,
    check_replica_batch,
)

BATCH_AXIS = "batch"
MODEL_AXIS = "model"
# Variable path inside an encoder block -> the mesh axis of each dimension (MODEL_AXIS shards).
BLOCK_LAYOUTS = {
    # [D, N, H] -> N heads; the bias [N, H] follows.
    "MultiHeadDotProductAttention_1/(query|key|value)/kernel": (None, MODEL_AXIS, None),
    "MultiHeadDotProductAttention_1/(query|key|value)/bias": (MODEL_AXIS, None),
    # [N, H, D]: each device's heads give a partial sum of the output, all-reduced.
    "MultiHeadDotProductAttention_1/out/kernel": (MODEL_AXIS, None, None),
    # [D, M] -> M units; the bias [M] follows.
    "MlpBlock_3/Dense_0/kernel": (None, MODEL_AXIS),
    "MlpBlock_3/Dense_0/bias": (MODEL_AXIS,),
    # [M, D]: each device's units give a partial sum of the output, all-reduced.
    "MlpBlock_3/Dense_1/kernel": (MODEL_AXIS, None),
}


def _transformer_sizes(config):
    """(num_heads, mlp_dim) of a variant name, a `keras_vit.ViT` model or its arguments."""
    if isinstance(config, keras.Model):
        config = vit_config(config)
    elif not isinstance(config, dict):
        config = get_variant(config).config()
    config = {**VIT_DEFAULTS, **config}
    return config["num_heads"], config["mlp_dim"]


def layout_map(config, mesh, model_axis=MODEL_AXIS):
    """The `keras.distribution.LayoutMap` that shards each encoder block over `model_axis`.

    Args:
        config: the model to shard: a variant name ("L/16"), a dict of `keras_vit.ViT`
            arguments (its defaults fill the rest), or a `keras_vit.ViT` model.
        mesh: `keras.distribution.DeviceMesh`.
        model_axis: str. The mesh axis the heads and MLP units are split over. Defaults to
            "model".

    Returns:
        A `LayoutMap` for `keras.distribution.ModelParallel(layout_map=...)`: query, key and
        value kernels `[D, N, H]` sharded on heads, the output kernel `[N, H, D]` on heads,
        the MLP's `Dense_0` kernel `[D, M]` on its output and `Dense_1` `[M, D]` on its input;
        every other variable replicated.

    Raises:
        ValueError: if `model_axis` is not an axis of `mesh`, or `num_heads` or `mlp_dim` is
            not divisible by its size.
    """
    if not isinstance(mesh, keras.distribution.DeviceMesh):
        raise ValueError("`mesh` must be a keras.distribution.DeviceMesh. Received: "
                         f"mesh={mesh!r:.100}")
    check_choice("model_axis", model_axis, tuple(mesh.axis_names))
    size = mesh.shape[list(mesh.axis_names).index(model_axis)]
    num_heads, mlp_dim = _transformer_sizes(config)
    check_divisible("num_heads", num_heads, f"the {model_axis!r} axis size", size)
    check_divisible("mlp_dim", mlp_dim, f"the {model_axis!r} axis size", size)
    layouts = keras.distribution.LayoutMap(mesh)
    for path, axes in BLOCK_LAYOUTS.items():
        axes = tuple(model_axis if axis == MODEL_AXIS else axis for axis in axes)
        layouts[rf"(.*/)?encoderblock_\d+/{path}"] = axes
    return layouts


# The environment of a multi-process run, as Keras reads it (`keras.distribution.initialize`).
CLUSTER_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                     "KERAS_DISTRIBUTION_PROCESS_ID")


def start_from_environment():
    """For a command-line run on JAX, before anything computes: joins the cluster the
    environment describes (`keras.distribution.initialize()`, which starts `jax.distributed`,
    where `KERAS_DISTRIBUTION_*` are set), and sets data parallelism over every device of
    every process where there is more than one (unless a distribution is set).

    Returns:
        The distribution in effect, or None.

    Raises:
        ValueError: with `KERAS_DISTRIBUTION_*` set on another backend than JAX.
    """
    joined = [name for name in CLUSTER_VARIABLES if name in os.environ]
    if keras.backend.backend() != "jax":
        if joined:
            raise ValueError(f"{joined[0]} is set: it describes a multi-process JAX run, but "
                             f"Keras runs on {keras.backend.backend()}. Expected --backend jax "
                             "(or TF_CONFIG for a TensorFlow cluster).")
        return None
    if joined:
        keras.distribution.initialize()
    if keras.distribution.distribution() is None and \
            len(keras.distribution.list_devices()) > 1:
        keras.distribution.set_distribution(get_distribution())
    return keras.distribution.distribution()


def get_distribution(config=None, model_parallel=1, devices=None):
    """A `keras.distribution` over `devices`: data parallel, or data x model parallel.

    Set it with `keras.distribution.set_distribution(...)` (or enter its `scope()`) before
    building the model, and keep it set while training: Keras creates each variable with its
    layout. The global batch is split over the "batch" axis of the mesh.

    Args:
        config: the model (see `layout_map`); needed with `model_parallel > 1`.
        model_parallel: int. Devices each model replica is sharded over (the "model" axis);
            1 replicates the model on every device (`keras.distribution.DataParallel`).
            Defaults to 1.
        devices: list of str. Device names ("gpu:0", ...). Defaults to
            `keras.distribution.list_devices()`: every accelerator, else every CPU device.

    Returns:
        `DataParallel` with `model_parallel=1`, else `ModelParallel` on a
        `(len(devices) // model_parallel, model_parallel)` mesh with axes ("batch", "model").

    Raises:
        ValueError: if `model_parallel` does not divide the device count, if the model's
            `num_heads` or `mlp_dim` is not divisible by it, without `config` when needed, or
            for `devices` that are empty, repeated or not on this machine.
    """
    model_parallel = check_positive_int("model_parallel", model_parallel)
    devices = keras.distribution.list_devices() if devices is None else check_devices(devices)
    if len(devices) % model_parallel:
        divisors = [d for d in range(1, len(devices) + 1) if len(devices) % d == 0]
        raise ValueError(
            f"model_parallel {model_parallel} does not divide the {len(devices)} devices. "
            f"Expected one of {', '.join(map(str, divisors))}.")
    if model_parallel == 1:
        return keras.distribution.DataParallel(devices=devices)
    if config is None:
        raise ValueError(f"model_parallel {model_parallel} shards the model, so `config` must "
                         "name it. Expected a variant name, `keras_vit.ViT` arguments or a "
                         "model. Received: config=None")
    mesh = keras.distribution.DeviceMesh(
        (len(devices) // model_parallel, model_parallel), (BATCH_AXIS, MODEL_AXIS), devices)
    return keras.distribution.ModelParallel(layout_map=layout_map(config, mesh),
                                            batch_dim_name=BATCH_AXIS)


def _devices_of_type(device_type):
    """This machine's devices of one type ("cpu", "gpu", "tpu"); none for an unknown type."""
    try:
        return keras.distribution.list_devices(device_type)
    except (RuntimeError, ValueError):  # the backend has no such device type
        return []


def check_devices(devices):
    """Returns `devices` as a list of lower-case names, if they are distinct devices of this
    machine (`keras.distribution.list_devices(type)`, e.g. "gpu:0").

    Raises:
        ValueError: for a non-list, an empty list, a repeated device or an unknown one.
    """
    if not isinstance(devices, (list, tuple)) or not all(isinstance(d, str) for d in devices):
        raise ValueError("`devices` must be a list of device names such as 'gpu:0'. Received: "
                         f"devices={devices!r:.100}")
    names = [d.lower() for d in devices]
    if not names:
        raise ValueError("`devices` is empty. Expected device names such as 'gpu:0', or None "
                         "for every accelerator (else every CPU device).")
    repeated = sorted({d for d in names if names.count(d) > 1})
    if repeated:
        raise ValueError(f"`devices` names {', '.join(repeated)} more than once. Expected "
                         "distinct devices.")
    for name in names:
        if name not in _devices_of_type(name.partition(":")[0]):
            known = dict.fromkeys(keras.distribution.list_devices() + _devices_of_type("cpu"))
            raise ValueError(f"Device {name!r} is not on this machine, whose devices are "
                             f"{', '.join(known)}. Expected some of them.")
    return names


def check_batches(batch_size, num_examples=None):
    """Raises unless batches of `batch_size` split evenly across the current distribution's
    data-parallel devices; with `num_examples` (an evaluation set, whose last batch may be
    partial), the last batch too.

    Raises:
        ValueError: naming the batch and the device count.
    """
    replicas = data_parallel_size()
    check_replica_batch(batch_size, replicas)
    # With whole batches that split, the last batch splits iff the example count does.
    if num_examples is not None and num_examples % replicas:
        example = max(replicas, num_examples // replicas * replicas)
        raise ValueError(
            f"{num_examples} evaluation examples in batches of {batch_size} end with a batch of "
            f"{num_examples % batch_size}, which does not split across {replicas} replicas. "
            f"Expected a multiple of {replicas} examples (e.g. {example}).")
    return batch_size
