"""Helper for tests/test_distribute.py (no tests here): training under a strategy, in a process.

    python tests/test_distribute_run.py mirrored OUT_JSON
    python tests/test_distribute_run.py worker OUT_JSON INDEX PORT0,PORT1

`mirrored` splits the CPU into 2 logical devices and trains the same steps under the default
strategy and under MirroredStrategy. `worker` is one of 2 MultiWorkerMirroredStrategy workers on
localhost (TF_CONFIG). Both write the losses and final weights to OUT_JSON.
"""

import functools
import json
import os
import sys
import threading
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TINY = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            num_classes=3)
GLOBAL_BATCH = 8
STEPS = 3


def arrays():
    import numpy as np

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (28, 8, 8, 3), dtype=np.uint8)
    return images, np.arange(28) % 3


def initial_weights():
    """Deterministic initial weights with a non-zero head (every parameter gets a gradient)."""
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(**TINY)
    rng = np.random.default_rng(1)
    model.get_layer("head").kernel.assign(rng.normal(0, 1, (16, 3)).astype("float32"))
    return model.get_weights()


def train(strategy=None, jit_compile=None):
    """Trains STEPS steps of the fine-tuning recipe; returns (losses per epoch, weights, model)."""
    import tensorflow as tf

    import keras_vit
    from keras_vit import data, training

    strategy = strategy or tf.distribute.get_strategy()
    images, labels = arrays()
    pipeline = data.from_arrays(images, labels, image_size=8, batch_size=GLOBAL_BATCH,
                                training=True, seed=3, augment=False, strategy=strategy)
    weights = initial_weights()
    with strategy.scope():
        model = keras_vit.ViT(**TINY)
        model.set_weights(weights)
        training.compile_finetune(model, learning_rate=0.1, total_steps=2 * STEPS,
                                  warmup_steps=1, jit_compile=jit_compile)
    history = model.fit(pipeline.dataset, steps_per_epoch=STEPS, epochs=2, verbose=0)
    return history.history["loss"], model


def dump(path, **values):
    import numpy as np

    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, np.ndarray):
            return v.tolist()
        return v

    with open(path, "w") as f:
        json.dump({k: plain(v) for k, v in values.items()}, f)


def mirrored(out):
    import keras
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_vit import data, routes, training
    from keras_vit.parallel import tf_distribute as distribute

    strategy = distribute.get_strategy("mirrored")
    single_loss, single = train()
    mirrored_loss, model = train(strategy)
    images, labels = arrays()
    try:
        data.from_arrays(images, labels, image_size=8, batch_size=5, training=True,
                         strategy=strategy)
        batch_error = None
    except ValueError as e:
        batch_error = str(e)
    # A `use_routes` block around fit reaches the steps MirroredStrategy runs in its replica
    # threads: every replica's encoder block is recomputed (Keras' `remat` applied to it), with
    # the same losses; "auto" in a block over the process's "blocks" gives the default there.
    remat_threads, auto_threads = [], []
    with mock.patch.object(keras, "remat", functools.partial(_record_thread, remat_threads,
                                                             keras.remat)):
        with routes.use_routes(remat="blocks"):
            remat_loss, _ = train(strategy)
    routes.set_routes(remat="blocks")
    with mock.patch.object(keras, "remat", functools.partial(_record_thread, auto_threads,
                                                             keras.remat)):
        with routes.use_routes(remat="auto"):
            train(strategy)
    routes.set_routes(remat="auto")
    try:
        train(strategy, jit_compile=True)
        xla_error = None
    except Exception as e:  # noqa: BLE001 - recorded for the test to check
        xla_error = f"{type(e).__name__}: {e}"
    dump(out, replicas=strategy.num_replicas_in_sync, single_loss=single_loss,
         mirrored_loss=mirrored_loss, single_jit=single.jit_compile, mirrored_jit=model.jit_compile,
         single_weights=single.get_weights(), mirrored_weights=model.get_weights(),
         default_jit=training.default_jit_compile(strategy), batch_error=batch_error,
         xla_error=xla_error, remat_loss=remat_loss, remat_threads=remat_threads,
         auto_threads=auto_threads)


def _record_thread(threads, function, *args, **kwargs):
    threads.append(threading.current_thread().name)
    return function(*args, **kwargs)


def worker(out, index, ports):
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports.split(",")]},
        "task": {"type": "worker", "index": int(index)},
    })
    import tensorflow as tf

    from keras_vit.parallel import tf_distribute as distribute

    strategy = distribute.get_strategy("auto")
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy), strategy
    losses, model = train(strategy)
    images, labels = arrays()
    from keras_vit import data

    # 2 batches: one per worker, so that averaging the workers' means is the global mean.
    evaluation = data.from_arrays(images[:16], labels[:16], image_size=8,
                                  batch_size=GLOBAL_BATCH, training=False)
    eval_loss, eval_accuracy = model.evaluate(evaluation.dataset, verbose=0)
    dump(out, replicas=strategy.num_replicas_in_sync, losses=losses, jit=model.jit_compile,
         weights=model.get_weights(), eval_loss=eval_loss, eval_accuracy=eval_accuracy,
         chief=distribute.is_chief())


if __name__ == "__main__":
    mode, out, *rest = sys.argv[1:]
    {"mirrored": mirrored, "worker": worker}[mode](out, *rest)
