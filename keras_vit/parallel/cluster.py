"""This process's place in a run of several processes: a TF_CONFIG cluster (`tf.distribute`'s
MultiWorkerMirroredStrategy) or a multi-process JAX run (`keras.distribution.initialize()`,
which starts `jax.distributed`). One of them, the chief, writes a run's shared files; each
keeps its own backup. (Each process's share of every batch is Keras' own: a multi-process
`keras.distribution` shards a `tf.data` pipeline by itself.)"""

import keras

from keras_vit.parallel import tf_distribute


def jax_process():
    """`(index, count)` of this process in a multi-process JAX run, `(0, 1)` elsewhere."""
    if keras.backend.backend() != "jax":
        return 0, 1
    import jax  # the JAX backend's own runtime, on that backend only

    return jax.process_index(), jax.process_count()


def is_chief():
    """Whether this process writes a run's shared outputs: the chief of a TF_CONFIG cluster
    (worker 0 if it has none), process 0 of a multi-process JAX run, or a lone process."""
    return tf_distribute.is_chief() and jax_process()[0] == 0


def process_name():
    """This process's name among several, for its own backup and logs folders: `worker-1`
    (TF_CONFIG), `process-1` (JAX); None for a lone process."""
    if tf_distribute.tf_config_workers() > 1:
        return "{}-{}".format(*tf_distribute.worker_index())
    index, count = jax_process()
    return f"process-{index}" if count > 1 else None
