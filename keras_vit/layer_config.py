"""What every keras_vit layer shares: a config made of its constructor arguments, Keras'
way of saving a quantized layer's sublayers' policies with it, and a floating-point policy.
"""

import keras


class ConfigArgs:
    """`get_config()` = Keras' base config plus the constructor arguments named in
    `CONFIG_ARGS`, each kept on the layer under its own name: `from_config(get_config())`
    rebuilds the same layer.

    After `model.quantize(...)` the layer's `dtype` in the config is a
    `keras.dtype_policies.DTypePolicyMap` from its quantized sublayers' paths to their
    policies (Keras' own way, as keras-hub does): `build` gives each Keras sublayer its entry
    (`sublayer_policy`) and each keras_vit sublayer the map, so a reloaded layer builds them
    quantized again and their int8 weights load.
    """

    CONFIG_ARGS = ()
    # Keys that configs written by earlier versions hold and that are no arguments any more:
    # the execution routes (`kernels`) that 0.3 saved. `from_config` drops them.
    LEGACY_KEYS = ("kernels",)

    @classmethod
    def from_config(cls, config):
        return super().from_config({key: value for key, value in config.items()
                                    if key not in cls.LEGACY_KEYS})

    def sublayer_policy(self, name):
        """The dtype policy for the sublayer `name` that `build` creates: its entry in the
        layer's `DTypePolicyMap` (a reloaded quantized layer), else the layer's own policy.

        A quantized Keras layer must hold its own quantized policy, not the map: Keras'
        EinsumDense reads `self.dtype_policy.quantization_mode` when it saves its weights.
        """
        policy = self.dtype_policy
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            path = f"{self.path}/{name}"
            if path in policy:
                return policy[path]
        return policy

    def get_config(self):
        config = dict(super().get_config(), **{name: getattr(self, name)
                                                for name in self.CONFIG_ARGS})
        policy_map = _quantized_policy_map(self)
        if policy_map is not None:
            config["dtype"] = keras.dtype_policies.serialize(policy_map)
        return config


def sublayers(layer):
    """Every layer nested in `layer` (its attributes, and lists of them), depth first."""
    found, seen, stack = [], {id(layer)}, [layer]
    while stack:
        for value in vars(stack.pop()).values():
            for item in (value if isinstance(value, (list, tuple)) else (value,)):
                if isinstance(item, keras.layers.Layer) and id(item) not in seen:
                    seen.add(id(item))
                    found.append(item)
                    stack.append(item)
    return found


def _quantized_policy_map(layer):
    """A `DTypePolicyMap` of `layer`'s policy with its quantized sublayers' policies by path,
    or None when none is quantized (or the layer's policy is a map already)."""
    if isinstance(layer.dtype_policy, keras.dtype_policies.DTypePolicyMap):
        return None
    quantized = [sub for sub in sublayers(layer) if sub.quantization_mode is not None]
    if not quantized:
        return None
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=layer.dtype_policy)
    for sub in quantized:
        policy_map[sub.path] = sub.dtype_policy
    return policy_map


def checked_policy(dtype):
    """The dtype policy `dtype` names (None: Keras' global one), for a model whose weights and
    computation are floating point: a ValueError naming `dtype` for a value that is no policy,
    or a policy of integers or booleans."""
    try:
        policy = keras.dtype_policies.get(keras.config.dtype_policy() if dtype is None else dtype)
    except (ValueError, TypeError):
        policy = None
    base = policy.default_policy if isinstance(policy, keras.dtype_policies.DTypePolicyMap) \
        else policy
    if base is None or not all(keras.backend.is_float_dtype(d) for d in (
            base.compute_dtype, base.variable_dtype)):
        raise ValueError(f"dtype={dtype!r:.60} is not a floating-point dtype policy. Expected "
                         "one of 'float32', 'mixed_bfloat16', 'mixed_float16', 'bfloat16', "
                         "'float16' (or a keras.DTypePolicy computing in floats).")
    return policy
