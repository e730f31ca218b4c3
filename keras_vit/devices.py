"""The device probe: what kind of device Keras runs on here, the CPU's features, and how many
ways the current `keras.distribution` splits a batch. Without TensorFlow, so that the routes (`keras_vit.routes`) can ask on every backend; the rest of how a
model executes is `keras_vit.execution`."""

import functools

import keras


@functools.lru_cache(maxsize=None)
def _cpuinfo(field):
    """The first value of `field` in /proc/cpuinfo, "" where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_flags():
    """The CPU's feature flags (`/proc/cpuinfo`), empty where unknown."""
    return frozenset(_cpuinfo("flags").split())


def cpu_vendor():
    """The CPU's vendor (`/proc/cpuinfo`'s vendor_id: "AuthenticAMD", "GenuineIntel"), ""
    where unknown."""
    return _cpuinfo("vendor_id")


def on_cpu():
    """Whether Keras' devices are all CPUs (no GPU or TPU)."""
    return all(device.lower().startswith("cpu") for device in keras.distribution.list_devices())


def device_kind():
    """"gpu" where Keras sees an accelerator (GPU or TPU), else "cpu"."""
    return "cpu" if on_cpu() else "gpu"


def data_parallel_size(distribution=None):
    """How many ways `distribution` (default: the current one) splits each batch: the size of
    its batch axis; 1 without a distribution."""
    distribution = distribution or keras.distribution.distribution()
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]
