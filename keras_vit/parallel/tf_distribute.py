"""`tf.distribute` strategies by name, global batch sizes, and the chief of a cluster.

```python
strategy = keras_vit.get_strategy("auto")      # TPU, several workers, several GPUs, or one device
with strategy.scope():
    model = keras_vit.ViT_B16(num_classes=10)
batch_size = keras_vit.parallel.global_batch_size(32, strategy, per_replica=True)
keras_vit.training.fit(model, train, output_dir="runs/x")   # compiles in the model's strategy
```
"""

import contextlib
import json
import os
import warnings

import keras

from keras_vit.devices import data_parallel_size
from keras_vit.checks import check_choice, check_positive_int, check_replica_batch

STRATEGIES = ("auto", "tpu", "mirrored", "multiworker", "cpu")


def _tf_config():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}). Received: {raw!r}") from e


def tf_config_workers():
    """The number of workers (chief included) in TF_CONFIG, 0 without TF_CONFIG."""
    cluster = _tf_config().get("cluster", {})
    return sum(len(cluster.get(job, ())) for job in ("chief", "worker"))


def _on_tpu_vm():
    # TPU VMs expose the chips as /dev/accel* (v4 and later) or /dev/vfio/* (v2, v3).
    return os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")


def _tpu_requested(tpu):
    """Whether a TPU is named or visible: an address, TPU_NAME, Colab's, or a TPU VM's chips."""
    return bool(tpu or os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR")
                or _on_tpu_vm())


def _tpu_strategy(tpu):
    import tensorflow as tf  # the strategies are TensorFlow's (see the module docstring)

    # An empty name lets the resolver read TPU_NAME / COLAB_TPU_ADDR; "local" is a TPU VM.
    name = tpu or os.environ.get("TPU_NAME") or ("local" if _on_tpu_vm() else "")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
        if name != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
        raise ValueError(
            f"No TPU found (tpu={tpu!r}, TPU_NAME={os.environ.get('TPU_NAME')!r}): {e}. "
            "Expected a TPU VM, a TPU address, or strategy 'auto' to fall back to GPUs/CPU."
        ) from e
    return tf.distribute.TPUStrategy(resolver)


def get_strategy(name="auto", tpu=None):
    """A `tf.distribute.Strategy` by name.

    Args:
        name: str. One of:
            - "auto": a TPU if one is named or visible (TPU VM, `TPU_NAME`); else
              MultiWorkerMirroredStrategy if TF_CONFIG names more than one worker; else
              MirroredStrategy over every GPU if there are several; else the default
              strategy (one GPU, or the CPU), under which Keras compiles with XLA.
            - "tpu": TPUStrategy through `TPUClusterResolver` (error without a TPU).
            - "mirrored": MirroredStrategy over every GPU, or every logical CPU device if there
              is no GPU (as in the tests).
            - "multiworker": MultiWorkerMirroredStrategy; needs TF_CONFIG.
            - "cpu": OneDeviceStrategy on the first CPU.
        tpu: str or None. TPU name or address for "tpu" / "auto". Defaults to TPU_NAME.

    Returns:
        A `tf.distribute.Strategy`; `strategy.num_replicas_in_sync` is the replica count the
        global batch is split over.

    Raises:
        ValueError: for an unknown name, "tpu" without a TPU, or "multiworker" without
            TF_CONFIG.
    """
    check_choice("strategy", name, STRATEGIES)
    import tensorflow as tf  # the strategies are TensorFlow's (see the module docstring)

    if name == "tpu" or (name == "auto" and _tpu_requested(tpu)):
        return _tpu_strategy(tpu)
    if name == "multiworker" or (name == "auto" and tf_config_workers() > 1):
        if not tf_config_workers():
            raise ValueError(
                "Strategy 'multiworker' needs TF_CONFIG describing the cluster, e.g. "
                '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": '
                '"worker", "index": 0}}. Received: TF_CONFIG unset.'
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored":
        devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
        if len(devices) == 1:
            warnings.warn(f"Strategy 'mirrored' has one replica: this process sees one device "
                          f"({devices[0]}). On a machine without GPUs, split the CPU first: "
                          "keras_vit.parallel.tf_distribute.split_cpu(N) before TensorFlow "
                          "starts, or --cpu-replicas N on the command line.", stacklevel=2)
        return tf.distribute.MirroredStrategy(devices)
    if name == "cpu":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def split_cpu(count):
    """Splits this machine's CPU into `count` logical devices, so that the "mirrored" strategy
    runs `count` replicas on a machine without GPUs (they share the cores: this tests and
    debugs data-parallel training; it does not make one machine faster). Call it before
    TensorFlow starts its runtime (before any op or device query); asking again for the count
    already in place is allowed.

    Raises:
        ValueError: for a count that is not a positive integer, or when TensorFlow has already
            started with another number of CPU devices.
    """
    count = check_positive_int("cpu_replicas", count)
    import tensorflow as tf  # its devices are TensorFlow's (see the module docstring)

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:  # the runtime has started: its devices are fixed
        current = len(tf.config.list_logical_devices("CPU"))
        if current != count:
            raise ValueError(f"split_cpu({count}): TensorFlow has already started with "
                             f"{current} CPU device(s), and cannot change them now. Expected "
                             "split_cpu at the start of the program, before any TensorFlow "
                             "op.") from None
    return count


def global_batch_size(batch_size, strategy=None, per_replica=False):
    """The global batch size under `strategy`, checked to split evenly across replicas.

    Args:
        batch_size: int. Per replica if `per_replica`, else global.
        strategy: `tf.distribute.Strategy` or None: the current one; on another backend,
            the ways the current `keras.distribution` splits a batch (1 without one).
        per_replica: bool. Scale a per-replica (per-core, per-GPU) batch up by the replica
            count, as TPU recipes are usually written. Defaults to False.

    Returns:
        int. The batch size to give the input pipeline.

    Raises:
        ValueError: if a global batch size is not divisible by the number of replicas.
    """
    replicas = _replicas(strategy or current_strategy())
    if per_replica:
        return check_positive_int("batch_size", batch_size) * replicas
    return check_replica_batch(batch_size, replicas)


def current_strategy():
    """The `tf.distribute` strategy in scope (the default one outside any scope); None on
    another backend (JAX distributes with `keras.distribution` instead)."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf  # the strategies are TensorFlow's (see the module docstring)

    return tf.distribute.get_strategy()


def is_multiworker(strategy):
    """Whether `strategy` (a TensorFlow strategy) runs collectives across more than one worker
    process."""
    import tensorflow as tf  # a strategy here is TensorFlow's, and it is loaded

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    spec = strategy.cluster_resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in spec.jobs if job in ("chief", "worker")) > 1


def worker_index():
    """(task_type, task_index) of this process from TF_CONFIG; ("worker", 0) outside a cluster."""
    if tf_config_workers() <= 1:
        return "worker", 0
    task = _tf_config().get("task", {})
    return task.get("type", "worker"), int(task.get("index", 0))


def is_chief():
    """Whether this process writes shared outputs: the chief, or worker 0 if there is none."""
    task_type, index = worker_index()
    if "chief" in _tf_config().get("cluster", {}):
        return task_type == "chief"
    return task_type == "worker" and index == 0


def model_strategy(model):
    """The `tf.distribute` strategy `model` was built under, or None on another backend
    (JAX distributes with `keras.distribution` instead)."""
    return getattr(model, "distribute_strategy", None)


def strategy_scope(model):
    """The scope of `model`'s strategy (a no-op context on other backends)."""
    strategy = model_strategy(model)
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def num_replicas(model):
    """How many replicas `model`'s strategy splits a global batch over; on other backends, the
    current `keras.distribution`'s (1 without one)."""
    return _replicas(model_strategy(model))


def _replicas(strategy):
    """`strategy`'s replicas; without one (other backends), the current `keras.distribution`'s
    (1 without one)."""
    return data_parallel_size() if strategy is None else strategy.num_replicas_in_sync
