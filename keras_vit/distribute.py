"""`tf.distribute` strategies by name, batch-size scaling, and a fix for multi-worker `fit`.

```python
strategy = keras_vit.get_strategy("auto")      # TPU, several workers, several GPUs, or one device
with strategy.scope():
    model = keras_vit.ViT_B16(num_classes=10)
    keras_vit.training.compile_finetune(model, total_steps=10_000)   # applies the fix below
batch_size = keras_vit.distribute.global_batch_size(32, strategy, per_replica=True)
```

Keras 3.15 `Model.fit` breaks under `MultiWorkerMirroredStrategy` with more than one worker
(keras-team/keras#20585), in two places of its TensorFlow trainer:

1. `_maybe_symbolic_build` reduces the first distributed batch with `strategy.reduce`
   eagerly, which the collective strategy cannot do ("Attempt to convert a value (PerReplica
   ...) to a Tensor");
2. `reduce_per_replica` reduces the scalar logs with `strategy.reduce("MEAN", v, axis=0)`,
   and a scalar has no axis 0 ("Invalid reduction dimension 0 for input with 0 dimensions").

`enable_multiworker_fit(model)` fixes both on the model instance only: the symbolic build
takes the first local replica's batch (only its shapes matter), and the train and test steps
return their logs as `[1]` vectors, so that the reduction over axis 0 averages the replicas.

Under any strategy with several replicas, Keras 3.15's TensorFlow optimizer clips gradients
(`clipnorm`, `global_clipnorm`) *before* summing them across replicas: each replica's share is
clipped on its own, and the result differs from one device. The paper's recipe clips the
full-batch gradient at global norm 1. `reduce_gradients_before_clipping(optimizer)` sums the
gradients first (the all-reduce Keras would do anyway) and lets Keras clip the sum.

`keras_vit.training.compile_model` applies both for you.
"""

import json
import os
import types

import tensorflow as tf

STRATEGIES = ("auto", "tpu", "mirrored", "multiworker", "cpu")


def _tf_config():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}). Received: {raw!r}") from e


def _tf_config_workers():
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
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}. Expected one of {', '.join(STRATEGIES)}.")
    if name == "tpu" or (name == "auto" and _tpu_requested(tpu)):
        return _tpu_strategy(tpu)
    if name == "multiworker" or (name == "auto" and _tf_config_workers() > 1):
        if not _tf_config_workers():
            raise ValueError(
                "Strategy 'multiworker' needs TF_CONFIG describing the cluster, e.g. "
                '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": '
                '"worker", "index": 0}}. Received: TF_CONFIG unset.'
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored":
        devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "cpu":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def global_batch_size(batch_size, strategy=None, per_replica=False):
    """The global batch size under `strategy`, checked to split evenly across replicas.

    Args:
        batch_size: int. Per replica if `per_replica`, else global.
        strategy: `tf.distribute.Strategy` or None (the current one).
        per_replica: bool. Scale a per-replica (per-core, per-GPU) batch up by the replica
            count, as TPU recipes are usually written. Defaults to False.

    Returns:
        int. The batch size to give the input pipeline.

    Raises:
        ValueError: if a global batch size is not divisible by the number of replicas.
    """
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}")
    if per_replica:
        return batch_size * replicas
    if batch_size % replicas:
        raise ValueError(
            f"batch_size {batch_size} is not divisible across {replicas} replicas. Expected a "
            f"multiple of {replicas} (e.g. {max(1, batch_size // replicas) * replicas})."
        )
    return batch_size


def is_multiworker(strategy):
    """Whether `strategy` runs collectives across more than one worker process."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode()
    )


def worker_index():
    """(task_type, task_index) of this process from TF_CONFIG; ("worker", 0) outside a cluster."""
    if _tf_config_workers() <= 1:
        return "worker", 0
    task = _tf_config().get("task", {})
    return task.get("type", "worker"), int(task.get("index", 0))


def is_chief():
    """Whether this process writes shared outputs: the chief, or worker 0 if there is none."""
    task_type, index = worker_index()
    if "chief" in _tf_config().get("cluster", {}):
        return task_type == "chief"
    return task_type == "worker" and index == 0


def _logs_as_vectors(step):
    def wrapped(data):
        # Each scalar log becomes [1]: the multi-worker reduction over axis 0 then averages
        # the replicas' values instead of failing on a scalar.
        return {k: tf.reshape(v, [1]) for k, v in step(data).items()}

    return wrapped


def enable_multiworker_fit(model):
    """Makes `model.fit` / `evaluate` work under multi-worker MirroredStrategy (Keras 3.15).

    Does nothing unless `model` was created under a multi-worker strategy. See the module
    docstring for what it changes and why; it patches this model instance only.

    Returns:
        The model.
    """
    strategy = model.distribute_strategy
    if not is_multiworker(strategy) or getattr(model, "_keras_vit_multiworker", False):
        return model

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v,
                    batch,
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = types.MethodType(maybe_symbolic_build, model)
    model.train_step = _logs_as_vectors(model.train_step)
    model.test_step = _logs_as_vectors(model.test_step)
    model._keras_vit_multiworker = True
    return model


def reduce_gradients_before_clipping(optimizer):
    """Makes a Keras optimizer all-reduce gradients across replicas before clipping them.

    Keras 3.15 clips each replica's gradients, then sums them in `_backend_update_step`. This
    patches the optimizer instance (or the inner optimizer of a `LossScaleOptimizer`): in a
    replica context with several replicas, `apply` first sums the gradients across replicas,
    then runs Keras' own clipping, weight decay and update on the sum, skipping the second
    all-reduce. On one replica nothing changes.

    Returns:
        The optimizer.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if getattr(inner, "_keras_vit_reduce_first", False):
        return optimizer
    keras_apply = inner.apply
    keras_all_reduce = inner._all_reduce_sum_gradients
    reduced = []  # non-empty while `apply` runs on already-reduced gradients

    def apply(grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return keras_apply(grads, trainable_variables)
        variables = trainable_variables or inner._trainable_variables
        grads = [g for g, _ in keras_all_reduce(list(zip(grads, variables)))]
        reduced.append(True)
        try:
            return keras_apply(grads, trainable_variables)
        finally:
            reduced.pop()

    def all_reduce_sum_gradients(grads_and_vars):
        return list(grads_and_vars) if reduced else keras_all_reduce(grads_and_vars)

    inner.apply = apply
    inner._all_reduce_sum_gradients = all_reduce_sum_gradients
    inner._keras_vit_reduce_first = True
    return optimizer
