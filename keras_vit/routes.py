"""The seam between the model and its fast implementations: execution routes.

The layers (`keras_vit.layers`, `keras_vit.encoder`) say what they compute; this module decides
how. Each function computes its piece by the paper's formula, or by a faster route where one
was measured to pay on a path users run. The routes are named in `CHOICES`. A route is an
execution setting, not part of the architecture: no layer or saved model holds one. Every
choice takes the measured default of `default_route` for the backend, the devices, the
precision and the training flag, unless the process (`set_routes`) or the calls inside a
`with use_routes(...)` block choose one. A route is read when Keras traces the model's
function: on the first call of `predict`, `fit` or a compiled function (or on every eager call).
BENCHMARKS.md has the numbers behind each default, and `python -m benchmarks.routes` measures
any choice against another on the machine at hand.

Examples:
>>> with use_routes(attention="products"):
...     route("attention", training=False)
'products'
"""

import contextlib
import contextvars
import math
import warnings

import keras
from keras import ops

from keras_vit.devices import on_cpu
from keras_vit.encoder_ops import after, sequential_scan

# Every choice and its implementations; "auto" (or leaving it out) is the measured default.
CHOICES = {
    # How softmax(q k^T / sqrt(k)) v is computed: "products", the two matrix products with the
    # softmax between them, written out (`attention_probabilities`); "fused",
    # `keras.ops.dot_product_attention`, one operation that a backend may run as one kernel
    # (cuDNN flash attention under JAX on a GPU); "memory_efficient", blocks of queries in
    # turn, whose backward pass keeps only the queries, keys, values, the context and each
    # row's log-sum-exp and recomputes each block's probabilities
    # (`memory_efficient_attention`): no `[B, h, N, N]` tensor is ever whole.
    "attention": ("products", "fused", "memory_efficient"),
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

# The process's choices (`set_routes`) and those of the `use_routes` blocks around this call.
_PROCESS = {}
_BLOCK = contextvars.ContextVar("keras_vit_routes", default={})


def check_routes(routes):
    """Returns `routes` (None or a dict of `CHOICES` names to one of their implementations or
    "auto") as a plain dict, or raises naming the bad entry."""
    if routes is None:
        return {}
    if not isinstance(routes, dict):
        raise ValueError("Routes must be a dict such as {'attention': 'fused'}. "
                         f"Received: {routes!r}")
    for name, implementation in routes.items():
        if name not in CHOICES:
            raise ValueError(f"Unknown route choice {name!r}. Expected some of "
                             f"{', '.join(map(repr, CHOICES))}.")
        allowed = (AUTO, *CHOICES[name])
        if implementation not in allowed:
            raise ValueError(f"Route {name!r} must be one of {', '.join(map(repr, allowed))}. "
                             f"Received: {implementation!r}")
    return dict(routes)


def set_routes(**routes):
    """Chooses routes for the rest of the process (e.g. `set_routes(attention="fused")`);
    "auto" gives a choice back to its measured default. Returns the process's choices."""
    _PROCESS.update(check_routes(routes))
    for name in [name for name, chosen in _PROCESS.items() if chosen == AUTO]:
        del _PROCESS[name]
    return dict(_PROCESS)


@contextlib.contextmanager
def use_routes(**routes):
    """Chooses routes for the calls inside the block (this thread or task only), over the
    process's choices. A model's function traced inside keeps them."""
    token = _BLOCK.set(dict(_BLOCK.get(), **check_routes(routes)))
    try:
        yield
    finally:
        _BLOCK.reset(token)


def chosen_routes():
    """The routes chosen here and now: the process's, then the enclosing blocks'."""
    return {name: value for name, value in dict(_PROCESS, **_BLOCK.get()).items()
            if value != AUTO}


def default_route(name, training, dtype="float32"):
    """The measured default implementation of choice `name` (BENCHMARKS.md: "The routes
    behind `keras_vit.routes`" and "Training memory at 384 px").

    - attention: "fused" at inference on an accelerator (cuDNN's flash attention on a GPU under
      JAX), "products" on a CPU (no fused kernel there: the fused operation was no faster) and
      in training (the fused operation's backward was slower, on a GPU and on a CPU).
      "memory_efficient" is chosen, not a default: in TensorFlow's graph runtime it held less
      memory than the products (3% at 197 tokens, 16-21% at 577), and its recomputation and
      loops took more time (0.95x the step at 577 tokens, and 2-5 s more for the first).
    - block_input: "barrier" in training on JAX with CPU devices (XLA's CPU backend otherwise
      recomputes the residual stream's gradient in every block's backward pass), else "plain".
    - mlp: "rows" at inference, "tokens" in training (XLA's training step was slower on rows).
    - gelu: "recompute" in training in float32 (less memory at the same speed), "autodiff"
      in 16-bit precisions (where recomputing cost more time than it saved memory).
    - layer_norm: "recompute" in training (less memory; in bfloat16 also faster).
    Both are "autodiff" at inference, which has no backward pass.
    """
    if name == "attention":
        return "products" if training or on_cpu() else "fused"
    if name == "block_input":
        jax_on_cpu = keras.backend.backend() == "jax" and on_cpu()
        return "barrier" if training and jax_on_cpu else "plain"
    if name == "mlp":
        return "tokens" if training else "rows"
    if name == "gelu":
        return "recompute" if training and dtype == "float32" else "autodiff"
    if name == "layer_norm":
        return "recompute" if training else "autodiff"
    raise ValueError(f"Unknown route choice {name!r}. Expected one of {', '.join(CHOICES)}.")


def route(name, training, dtype="float32"):
    """The implementation of choice `name` here and now: the chosen one (`use_routes`,
    `set_routes`), else the default for the mode and the computation's dtype."""
    chosen = chosen_routes().get(name)
    if chosen is not None:
        return chosen
    return default_route(name, bool(training), keras.backend.standardize_dtype(dtype))


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
                          return_probabilities=False):
    """Scaled dot-product attention per head: softmax(q k^T / sqrt(k) + bias) v.

    Args:
        query, key, value: `[B, N, h, k]`.
        bias: `[B, h, N, N]` added to the scaled logits (relative position embeddings), or
            None.
        dropout: a `keras.layers.Dropout` applied to the probabilities, or None.
        training: bool. Whether dropout is on.
        return_probabilities: bool. Also return the probabilities `[B, h, N, N]` (before
            dropout): computed only then on the fused and memory-efficient routes.

    The fused and memory-efficient routes drop nothing: with dropout on the probabilities in
    training, the products run. The memory-efficient route also takes no bias (relative
    position embeddings) and needs the sequence length when the function is traced: else
    the products run.

    Returns:
        The context `[B, N, h, k]`, or `(context, probabilities)`.
    """
    dropping = training and dropout is not None and dropout.rate > 0
    chosen = route("attention", training)
    blockwise = chosen == "memory_efficient" and bias is None and query.shape[1] is not None
    if chosen in ("fused", "memory_efficient") and (dropping or (
            chosen == "memory_efficient" and not blockwise)):
        _fell_back(chosen, "dropout on the attention probabilities in training" if dropping
                   else "a bias on the logits (relative position embeddings)"
                   if bias is not None else "a sequence length unknown when traced")
    if chosen == "fused" and not dropping:
        context = ops.dot_product_attention(
            query, key, value, bias=None if bias is None else ops.cast(bias, query.dtype),
            scale=1.0 / math.sqrt(query.shape[-1]))
        probs = attention_probabilities(query, key, bias) if return_probabilities else None
    elif blockwise and not dropping:
        context = memory_efficient_attention(query, key, value)
        probs = attention_probabilities(query, key) if return_probabilities else None
    else:
        probs = attention_probabilities(query, key, bias)  # probs = [B, h, N, N]
        dropped = dropout(probs, training=training) if dropping else probs
        context = ops.einsum("bhqs,bshk->bqhk", dropped, value)  # context = [B, N, h, k]
    return (context, probs) if return_probabilities else context


# The (route, reason) pairs already reported in this process: each is said once.
_FELL_BACK = set()


def _fell_back(chosen, reason):
    """Says once per process that the chosen attention route cannot apply and the products
    run instead, and why."""
    if (chosen, reason) in _FELL_BACK:
        return
    _FELL_BACK.add((chosen, reason))
    warnings.warn(f"The {chosen!r} attention route cannot take {reason}: the products "
                  "(softmax(q k^T) v, every probability kept) run instead for these layers.",
                  stacklevel=3)


# Queries per block of the memory-efficient attention, at most: the sequence is cut into
# the fewest blocks of at most this many, all of one size (the last padded).
ATTENTION_BLOCK = 128


def memory_efficient_attention(query, key, value, block=ATTENTION_BLOCK):
    """softmax(q k^T / sqrt(k)) v per head over blocks of queries, one block after the other,
    with a custom gradient that keeps only the queries, keys, values, the context and each
    query's log-sum-exp of logits, and recomputes each block's probabilities in the backward
    pass (Rabe and Staats 2021, "Self-attention does not need O(n^2) memory"; the backward of
    FlashAttention, Dao et al. 2022). At most one block's `[B, h, block, N]` logits are alive.

    Matrix products run in the query's dtype and the softmax, its statistics and the
    accumulated gradients in float32, as in `attention_probabilities`.

    Every operation of the backward pass waits for the upstream gradient
    (`encoder_ops.after`), so that a graph runtime cannot run one (a transposed copy, the
    first block's probabilities) during the forward pass and hold its result until the
    backward pass.

    Args:
        query, key, value: `[B, N, h, k]`, N known when traced.
        block: int. Queries per block, at most; with N or more, one block and no loop.

    Returns:
        The context `[B, N, h, k]`, in the query's dtype.
    """
    length, depth = query.shape[1], query.shape[-1]
    count = -(-length // block)
    size = -(-length // count)  # queries per block
    scale = 1.0 / math.sqrt(depth)
    dtype = query.dtype

    def heads_first(x, padded=False):  # [B, N, h, ...] -> [B, h, N, ...], queries padded
        x = ops.transpose(x, (0, 2, 1, 3))
        return ops.pad(x, [(0, 0), (0, 0), (0, count * size - length), (0, 0)]) if padded else x

    def rows(x, i):  # block i of `x` along axis 2: [B, h, size, ...]
        if count == 1:
            return x
        starts = [0] * len(x.shape)
        starts[2] = i * size
        sizes = list(ops.shape(x))
        sizes[2] = size
        return ops.slice(x, starts, sizes)

    def joined(blocks):  # [count, B, h, size, ...] -> [B, h, N', ...], the padding kept
        x = ops.moveaxis(blocks, 0, 2)  # [B, h, count, size, ...]
        return ops.reshape(x, (*ops.shape(x)[:2], count * size, *ops.shape(x)[4:]))

    def logits_of(q, k, i):  # the scaled logits of block i in float32: [B, h, size, N]
        return ops.cast(ops.einsum("bhqk,bhsk->bhqs", rows(q, i) * ops.cast(scale, dtype), k),
                        "float32")

    def forward(q, k, v):  # heads first, the queries padded
        def step(carry, i):
            logits = logits_of(q, k, i)
            peak = ops.max(logits, axis=-1, keepdims=True)  # [B, h, size, 1]
            weights = ops.exp(logits - peak)
            total = ops.sum(weights, axis=-1, keepdims=True)
            # The context of the unnormalised weights, then divided: the division runs on
            # `[B, h, size, k]`, not on the probabilities' `[B, h, size, N]`.
            context = ops.einsum("bhqs,bhsk->bhqk", ops.cast(weights, dtype), v)
            context = ops.cast(ops.cast(context, "float32") / total, dtype)  # [B, h, size, k]
            return carry, (context, peak + ops.log(total))

        if count == 1:  # no loop
            _, (context, log_sum) = step((), 0)
            contexts, sums = context[None], log_sum[None]
        else:
            _, (contexts, sums) = sequential_scan(step, (), count)
        context = ops.transpose(joined(contexts)[:, :, :length], (0, 2, 1, 3))
        return context, joined(sums)  # [B, N, h, k], [B, h, N', 1]

    def backward(q, k, v, context, log_sums, upstream):
        q, k, v, log_sums = after((q, k, v, log_sums), upstream)
        g = heads_first(ops.cast(upstream, dtype), padded=True)  # [B, h, N', k]
        # The rows' sum of upstream gradient times context: softmax's backward term.
        g_dot_o = ops.sum(ops.cast(upstream, "float32") * ops.cast(context, "float32"), -1)
        g_dot_o = heads_first(g_dot_o[..., None], padded=True)  # [B, h, N', 1]

        def block_grads(i):  # block i's d_q and its terms of d_k and d_v (float32)
            probs = ops.exp(logits_of(q, k, i) - rows(log_sums, i))  # [B, h, size, N]
            g_block = rows(g, i)  # [B, h, size, k]
            d_v = ops.cast(ops.einsum("bhqs,bhqk->bhsk", ops.cast(probs, dtype), g_block),
                           "float32")
            d_probs = ops.cast(ops.einsum("bhqk,bhsk->bhqs", g_block, v), "float32")
            # The gradient of the logits before their scale, which multiplies the `[.., k]`
            # products below instead of the `[.., N]` logits.
            d_logits = ops.cast(probs * (d_probs - rows(g_dot_o, i)), dtype)
            d_k = ops.cast(ops.einsum("bhqs,bhqk->bhsk", d_logits, rows(q, i)), "float32")
            d_q = ops.einsum("bhqs,bhsk->bhqk", d_logits, k)
            return d_k * scale, d_v, d_q * ops.cast(scale, dtype)

        # The first block starts the sums (zeros to start from would not wait for `upstream`).
        d_k, d_v, d_q = block_grads(0)
        if count > 1:
            def step(carry, i):
                d_k, d_v, d_q = block_grads(i + 1)
                return (carry[0] + d_k, carry[1] + d_v), d_q

            (d_k, d_v), rest = sequential_scan(step, (d_k, d_v), count - 1)
            d_q = ops.concatenate([d_q[None], rest], axis=0)
        else:
            d_q = d_q[None]
        return tuple(ops.cast(grad, x.dtype) for grad, x in zip((joined(d_q), d_k, d_v),
                                                                  (q, k, v)))

    @ops.custom_gradient
    def attend(q, k, v):  # heads first, the queries padded
        context, log_sums = forward(q, k, v)

        def grad(*args, upstream=None):  # TensorFlow and JAX pass the upstream gradient
            return backward(q, k, v, context, log_sums,
                            args[0] if upstream is None else upstream)

        return context, grad

    return attend(heads_first(query, padded=True), heads_first(key), heads_first(value))


# --------------------------------------------------------------------------------------------
# Per-token functions (the MLP).


def per_token(fn, x, training=False):
    """`fn(x)` for a function `fn` of each token alone that keeps the width (the MLP), on
    `x = [B, N, D]` as it is (route "tokens") or on its `[B * N, D]` rows (route "rows")."""
    if route("mlp", training) == "tokens":
        return fn(x)
    shape = ops.shape(x)
    rows = fn(ops.reshape(x, (-1, shape[-1])))  # rows = [B * N, D]
    return ops.reshape(rows, shape)


def gelu(x, approximate, training=False):
    """GELU, the tanh approximation (`approximate`) or the exact one, as
    `keras.activations.gelu`; in training, by the chosen route for its backward pass."""
    if not training or route("gelu", training, x.dtype) == "autodiff":
        return keras.activations.gelu(x, approximate=approximate)

    @ops.custom_gradient
    def recompute(x):
        def grad(*args, upstream=None):  # TensorFlow and JAX pass the upstream gradient
            g = args[0] if upstream is None else upstream
            derivative = gelu_derivative(after(x, g), approximate)  # not before the backward
            return ops.cast(ops.cast(g, "float32") * derivative, g.dtype)

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


def layer_norm(layer, x, training=False):
    """`layer(x)` for a `keras.layers.LayerNormalization` over the last axis with scale and
    center; in training, by the chosen route for its backward pass. Both routes compute
    Keras' formula in float32 at least and return the layer's compute dtype."""
    if not training or route("layer_norm", training, x.dtype) == "autodiff":
        return layer(x)
    epsilon = layer.epsilon

    @ops.custom_gradient
    def recompute(x, gamma, beta):
        def grad(*args, upstream=None):  # TensorFlow and JAX pass the upstream gradient
            g = ops.cast(args[0] if upstream is None else upstream, "float32")
            x32 = ops.cast(after(x, g), "float32")  # recomputed in the backward pass, not before
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


def block_input(x, training=False):
    """An encoder block's input as the block uses it: `x` itself in the forward pass; in
    training, through `gradient_barrier` where that is the chosen (or default) route."""
    if training and route("block_input", training) == "barrier":
        return gradient_barrier(x)
    return x
