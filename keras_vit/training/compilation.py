"""A persistent compilation cache: compiled XLA programs kept on disk across processes, so that
a second run of the same training (a resume, the next experiment of a sweep) skips the
compilation of its steps.

JAX has one that works (`jax_compilation_cache_dir`). TensorFlow 2.21's persistent XLA cache
(`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory`) writes entries it then fails to read back
(BENCHMARKS.md), so it is not offered.
"""

import keras

from keras_vit.fileio import check_writable_dir


def enable_compilation_cache(directory):
    """Keeps every XLA program this process compiles in `directory` and reuses those that
    another process compiled there (JAX's persistent compilation cache).

    Args:
        directory: str or path. Created if missing; shared safely between runs and processes.

    Raises:
        ValueError: on a backend other than JAX, or an unwritable directory.
    """
    if keras.backend.backend() != "jax":
        raise ValueError(
            "A persistent compilation cache needs the JAX backend (KERAS_BACKEND=jax, or "
            f"`keras-vit train --backend jax`). Received backend {keras.backend.backend()!r}.")
    directory = check_writable_dir(directory, "Compilation cache folder")
    import jax  # optional (the JAX backend's), and installed since that backend is running

    jax.config.update("jax_compilation_cache_dir", directory)
    # Cache every program, however quick to compile (JAX's default skips those under 1 s).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
