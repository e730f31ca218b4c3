"""The seam between the model and its fast implementations.

The layers (`keras_vit.layers`, `keras_vit.encoder`) say what they compute; this module decides
how. Each function computes its piece by the paper's formula, or by a faster route where one
was measured to pay on a path users run. The routes are named in `CHOICES`; a layer's
`kernels` option (a dict such as `{"attention": "products"}`, passed down from
`keras_vit.ViT(kernels=...)`) picks one explicitly, and every choice it does not name takes the
measured default of `default_kernel` for the backend, the devices and the training flag.
BENCHMARKS.md has the numbers behind each default, and `python -m benchmarks.kernels` measures
any choice against another on the machine at hand.

Backend-specific code (a scan over stacked weights, the recomputation of a block with the same
dropout masks) lives here too, so that the layers hold no backend checks.
"""

import math

import keras
from keras import ops

# Every choice and its implementations; "auto" (or leaving it out) is the measured default.
CHOICES = {
    # How softmax(q k^T / sqrt(k)) v is computed: "products", the two matrix products with the
    # softmax between them, written out (`attention_probabilities`); "fused",
    # `keras.ops.dot_product_attention`, one operation that a backend may run as one kernel
    # (cuDNN flash attention under JAX on a GPU).
    "attention": ("products", "fused"),
    # The encoder block's input in training: "plain" (the identity), or "barrier", the
    # identity whose backward pass computes the residual stream's gradient once per block
    # (`gradient_barrier`).
    "block_input": ("plain", "barrier"),
    # The layout the MLP's products run on (`per_token`): "tokens", the `[B, N, D]` sequence
    # (Dense through tensordot), or "rows", its `[B * N, D]` rows (2-D matrix products, which
    # TensorFlow's graph runtime fuses with their bias and GELU in oneDNN).
    "mlp": ("tokens", "rows"),
    # The GELU's backward pass in training (`gelu`): "autodiff", through its formula (which
    # keeps the formula's intermediates), or "recompute", a custom gradient that keeps only
    # the input and computes the derivative from it.
    "gelu": ("autodiff", "recompute"),
    # A block's LayerNorms in training (`layer_norm`): "autodiff", Keras' layer (whose
    # backward keeps its full-size intermediates), or "recompute", a custom gradient that keeps
    # only the input and recomputes the statistics.
    "layer_norm": ("autodiff", "recompute"),
}
AUTO = "auto"


def check_kernels(kernels):
    """Returns `kernels` (None or a dict of `CHOICES` names to one of their implementations or
    "auto") as a plain dict, or raises naming the bad entry."""
    if kernels is None:
        return {}
    if not isinstance(kernels, dict):
        raise ValueError("`kernels` must be None or a dict such as {'attention': 'fused'}. "
                         f"Received: kernels={kernels!r}")
    for name, implementation in kernels.items():
        if name not in CHOICES:
            raise ValueError(f"Unknown kernel choice {name!r} in `kernels`. Expected some of "
                             f"{', '.join(map(repr, CHOICES))}.")
        allowed = (AUTO, *CHOICES[name])
        if implementation not in allowed:
            raise ValueError(f"`kernels[{name!r}]` must be one of "
                             f"{', '.join(map(repr, allowed))}. Received: {implementation!r}")
    return dict(kernels)


def _on_cpu():
    """Whether Keras' devices are all CPUs (no GPU or TPU)."""
    return all(device.lower().startswith("cpu") for device in keras.distribution.list_devices())


def default_kernel(name, training, dtype="float32"):
    """The measured default implementation of choice `name` (BENCHMARKS.md: "The routes
    behind `keras_vit.kernels`").

    - attention: "fused" at inference on an accelerator (cuDNN's flash attention on a GPU under
      JAX), "products" on a CPU (no fused kernel there: the fused operation was no faster) and
      in training (the fused operation's backward was slower, on a GPU and on a CPU).
    - block_input: "barrier" in training on JAX with CPU devices (XLA's CPU backend otherwise
      recomputes the residual stream's gradient in every block's backward pass), else "plain".
    - mlp: "rows" at inference, "tokens" in training (XLA's training step was slower on rows).
    - gelu: "recompute" in training in float32 (less memory at the same speed), "autodiff"
      in 16-bit precisions (where recomputing cost more time than it saved memory).
    - layer_norm: "recompute" in training (less memory; in bfloat16 also faster).
    Both are "autodiff" at inference, which has no backward pass.
    """
    if name == "attention":
        return "products" if training or _on_cpu() else "fused"
    if name == "block_input":
        jax_on_cpu = keras.backend.backend() == "jax" and _on_cpu()
        return "barrier" if training and jax_on_cpu else "plain"
    if name == "mlp":
        return "tokens" if training else "rows"
    if name == "gelu":
        return "recompute" if training and dtype == "float32" else "autodiff"
    if name == "layer_norm":
        return "recompute" if training else "autodiff"
    raise ValueError(f"Unknown kernel choice {name!r}. Expected one of {', '.join(CHOICES)}.")


def implementation(kernels, name, training, dtype="float32"):
    """The implementation of choice `name`: the one `kernels` names, else the default for
    the mode and the computation's dtype."""
    chosen = (kernels or {}).get(name, AUTO)
    if chosen != AUTO:
        return chosen
    return default_kernel(name, bool(training), keras.backend.standardize_dtype(dtype))


# --------------------------------------------------------------------------------------------
# Attention.


def attention_probabilities(query, key, bias=None):
    """softmax(q k^T / sqrt(k) + bias) per head: `[B, N, h, k]` query and key ->
    `[B, h, N, N]`.

    The softmax runs in float32 at least, so that mixed precision does not overflow; the
    result has the query's dtype.
    """
    scale = ops.cast(1.0 / math.sqrt(query.shape[-1]), query.dtype)
    logits = ops.cast(ops.einsum("bqhk,bshk->bhqs", query * scale, key), "float32")
    if bias is not None:
        logits = logits + ops.cast(bias, "float32")  # logits = [B, h, N, N]
    return ops.cast(ops.softmax(logits, axis=-1), query.dtype)


def dot_product_attention(query, key, value, bias=None, dropout=None, training=False,
                          kernels=None, return_probabilities=False):
    """Scaled dot-product attention per head: softmax(q k^T / sqrt(k) + bias) v.

    Args:
        query, key, value: `[B, N, h, k]`.
        bias: `[B, h, N, N]` added to the scaled logits (relative position embeddings), or
            None.
        dropout: a `keras.layers.Dropout` applied to the probabilities, or None.
        training: bool. Whether dropout is on.
        kernels: the layer's `kernels` option (see the module docstring).
        return_probabilities: bool. Also return the probabilities `[B, h, N, N]` (before
            dropout), from the same products where they are computed anyway.

    Returns:
        The context `[B, N, h, k]`, or `(context, probabilities)`.
    """
    route = implementation(kernels, "attention", training)
    dropping = training and dropout is not None and dropout.rate > 0
    if route == "fused" and not dropping:
        context = ops.dot_product_attention(
            query, key, value, bias=None if bias is None else ops.cast(bias, query.dtype),
            scale=1.0 / math.sqrt(query.shape[-1]))
        probs = attention_probabilities(query, key, bias) if return_probabilities else None
    else:
        probs = attention_probabilities(query, key, bias)  # probs = [B, h, N, N]
        dropped = dropout(probs, training=training) if dropping else probs
        context = ops.einsum("bhqs,bshk->bqhk", dropped, value)  # context = [B, N, h, k]
    return (context, probs) if return_probabilities else context


# --------------------------------------------------------------------------------------------
# Per-token functions (the MLP).


def per_token(fn, x, training=False, kernels=None):
    """`fn(x)` for a function `fn` of each token alone that keeps the width (the MLP), on
    `x = [B, N, D]` as it is (route "tokens") or on its `[B * N, D]` rows (route "rows")."""
    if implementation(kernels, "mlp", training) == "tokens":
        return fn(x)
    shape = ops.shape(x)
    rows = fn(ops.reshape(x, (-1, shape[-1])))  # rows = [B * N, D]
    return ops.reshape(rows, shape)


def gelu(x, approximate, training=False, kernels=None):
    """GELU, the tanh approximation (`approximate`) or the exact one, as
    `keras.activations.gelu`; in training, by the chosen route for its backward pass."""
    if not training or implementation(kernels, "gelu", training, x.dtype) == "autodiff":
        return keras.activations.gelu(x, approximate=approximate)

    @ops.custom_gradient
    def recompute(x):
        def grad(*args, upstream=None):  # TensorFlow and JAX pass the upstream gradient
            g = args[0] if upstream is None else upstream
            return ops.cast(ops.cast(g, "float32") * gelu_derivative(x, approximate), g.dtype)

        return keras.activations.gelu(x, approximate=approximate), grad

    return recompute(x)


def gelu_derivative(x, approximate):
    """d gelu(x) / dx in float32: with t = tanh(c (x + a x^3)), c = sqrt(2 / pi), a = 0.044715,
    `0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)`; exact: `Phi(x) + x phi(x)`."""
    x = ops.cast(x, "float32")
    if approximate:
        c, a = math.sqrt(2.0 / math.pi), 0.044715
        t = ops.tanh(c * (x + a * x * x * x))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x)
    cdf = 0.5 * (1.0 + ops.erf(x / math.sqrt(2.0)))
    return cdf + x * ops.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def layer_norm(layer, x, training=False, kernels=None):
    """`layer(x)` for a `keras.layers.LayerNormalization` over the last axis with scale and
    center; in training, by the chosen route for its backward pass. Both routes compute
    Keras' formula in float32 at least and return the layer's compute dtype."""
    if not training or implementation(kernels, "layer_norm", training, x.dtype) == "autodiff":
        return layer(x)
    epsilon = layer.epsilon

    @ops.custom_gradient
    def recompute(x, gamma, beta):
        def grad(*args, upstream=None):  # TensorFlow and JAX pass the upstream gradient
            g = ops.cast(args[0] if upstream is None else upstream, "float32")
            x32 = ops.cast(x, "float32")
            mean, variance = ops.moments(x32, axes=[-1], keepdims=True)
            rstd = ops.rsqrt(variance + epsilon)
            xhat = (x32 - mean) * rstd  # xhat = [..., D]
            axes = tuple(range(len(x.shape) - 1))
            d_xhat = g * ops.cast(gamma, "float32")
            d_x = rstd * (d_xhat - ops.mean(d_xhat, axis=-1, keepdims=True)
                          - xhat * ops.mean(d_xhat * xhat, axis=-1, keepdims=True))
            return (ops.cast(d_x, x.dtype), ops.cast(ops.sum(g * xhat, axis=axes), gamma.dtype),
                    ops.cast(ops.sum(g, axis=axes), beta.dtype))

        y = ops.layer_normalization(x, gamma, beta, epsilon=epsilon)
        return ops.cast(y, layer.compute_dtype), grad

    return recompute(x, layer.gamma.value, layer.beta.value)


# --------------------------------------------------------------------------------------------
# The encoder block's input.


def gradient_barrier(x):
    """The identity, whose backward pass computes the incoming gradient once, into memory.

    XLA's CPU backend (jaxlib 0.10) fuses the chain of additions that carries the residual
    stream's gradient back through the encoder into every one of its consumers, so that each
    block's backward recomputes the contributions of all the blocks above it: work quadratic
    in depth. XLA does not duplicate a floating-point division into several consumers, so the
    gradient `g / (1 + 0 * g)`, equal to `g` for every finite `g` (a non-finite one becomes
    NaN), is materialised once. Being a custom reverse-mode gradient, it has no forward-mode
    derivative (`jax.jvp` through it raises).
    """

    @ops.custom_gradient
    def barrier(x):
        def grad(*args, upstream=None):  # TensorFlow and JAX pass the upstream gradient
            g = args[0] if upstream is None else upstream
            return g / (1 + 0 * g)

        return x, grad

    return barrier(x)


def block_input(x, training=False, kernels=None):
    """An encoder block's input as the block uses it: `x` itself in the forward pass; in
    training, through `gradient_barrier` where that is the chosen (or default) route."""
    if training and implementation(kernels, "block_input", training) == "barrier":
        return gradient_barrier(x)
    return x


# --------------------------------------------------------------------------------------------
# Recomputation and scans over layers: the encoder's structure options (`keras_vit.encoder`).


def random_states(layer):
    """The layer's variables that are not weights: its dropout layers' seed-generator states
    (which `save_weights` leaves out)."""
    weights = {id(v) for v in layer.weights}
    return [v for v in layer.variables if id(v) not in weights]


def stateless_call(fn, weights, weight_values, states, state_values):
    """`fn()` with `weights` reading as `weight_values` and `states` (seed generators) as
    `state_values`, in a `keras.StatelessScope`: a pure function for JAX's transformations.

    Returns:
        (what `fn` returns, the states' values after it: the advanced seeds).
    """
    mapping = list(zip(weights, weight_values)) + list(zip(states, state_values))
    with keras.StatelessScope(state_mapping=mapping) as scope:
        result = fn()
    return result, [scope.get_current_value(state) for state in states]


def remat_call(layer, x, training):
    """`layer(x, training=training)`, keeping only `x` for the backward pass and recomputing
    the rest there (`keras.remat`), with the same dropout masks as the forward pass.

    TensorFlow's recompute_grad re-runs the function after the seed generators have advanced,
    which would draw new masks (and give wrong gradients), so each recomputation first restores
    the seeds of the forward pass. JAX's checkpoint traces a pure function: the seeds go in and
    the advanced seeds come out (assigning them inside would leak its tracers), and the
    recomputation replays the same seeds by construction.
    """
    states = random_states(layer)
    if not states:
        return keras.remat(lambda x: layer(x, training=training))(x)
    if keras.backend.backend() != "jax":
        seeds = [ops.copy(state.value) for state in states]  # the values, not the variables

        def forward(x):
            for state, seed in zip(states, seeds):
                state.assign(seed)
            return layer(x, training=training)

        return keras.remat(forward)(x)

    # A variable that a StatelessScope does not map reads as its stored value, not as the
    # value of an enclosing scope (Keras' JAX trainer runs the step in one): the weights are
    # mapped to their current values as well.
    weights = [w.value for w in layer.weights]

    def pure_forward(x, seeds):
        return stateless_call(lambda: layer(x, training=training), layer.weights, weights,
                              states, seeds)

    outputs, advanced = keras.remat(pure_forward)(x, [state.value for state in states])
    for state, value in zip(states, advanced):
        state.assign(value)
    return outputs


def can_scan(layers):
    """Whether `scan_layers` can run `layers`: on JAX, more than one layer, and weights of the
    same shapes and dtypes in each (LoRA or quantization of some layers only breaks that).
    TensorFlow cannot differentiate `keras.ops.scan` under XLA, and its while loop over the
    stacked weights was measured slower than the layers in turn."""
    layouts = {tuple((tuple(v.shape), v.dtype) for v in layer.weights) for layer in layers}
    return keras.backend.backend() == "jax" and len(layers) > 1 and len(layouts) == 1


def scan_layers(layers, x, training, remat=False):
    """Applies `layers` in turn to `x` as one traced layer scanned over their stacked weights
    (big_vision's scanned layout): `layers[0]`'s computation with each layer's weights. Dropout
    masks come from `layers[0]`'s seed generators, advanced from layer to layer. Check
    `can_scan(layers)` first.
    """
    template = layers[0]
    # Each weight stacked over the layers: [len(layers), *shape].
    stacked = [ops.stack([layer.weights[j].value for layer in layers])
               for j in range(len(template.weights))]
    seeds = random_states(template)

    def apply(x):
        return remat_call(template, x, training) if remat else template(x, training=training)

    def body(carry, layer_weights):
        x, seed_values = carry
        y, seed_values = stateless_call(lambda: apply(x), template.weights, layer_weights,
                                        seeds, seed_values)  # y = [B, N, D]
        return (y, seed_values), None

    (x, seed_values), _ = ops.scan(body, (x, [v.value for v in seeds]), stacked)
    for variable, value in zip(seeds, seed_values):
        variable.assign(value)
    return x
