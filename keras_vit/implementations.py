"""The implementations the routes choose between (`keras_vit.routes` holds the choices and
the dispatch): attention as its two products (`attention_probabilities`) or over blocks of
queries with a recomputing backward pass (`memory_efficient_attention`), or as the products
with a backward pass that recomputes the probabilities (`recomputed_attention`); GELU and LayerNorm
with a backward pass that keeps only their input (`recomputed_gelu`, `recomputed_layer_norm`),
GELU with the Dense after it likewise (`recomputed_gelu_dense`);
the identity whose backward pass materialises its gradient (`gradient_barrier`); and the
encoder's stack of blocks, each recomputed in the backward pass with the same dropout masks
(`remat_call`) or scanned as one traced block over stacked weights (`scan_layers`).

Every custom backward pass goes through `with_gradient`, the one custom-gradient helper. The
backend-specific code lives here, so that the layers hold no backend checks.
"""

import functools
import math

import keras
from keras import ops
from keras import tree


def with_gradient(forward, backward):
    """A function of tensors computed by `forward` with the backward pass `backward`
    (`keras.ops.custom_gradient`, one form for TensorFlow and JAX).

    Args:
        forward: `forward(*inputs) -> (outputs, saved)`: what the function returns and what its
            backward pass reads (any structure of tensors).
        backward: `backward(saved, upstream) -> gradients`: the gradient of each input (one
            tensor for one input, else a tuple), from the outputs' upstream gradient.
    """

    @ops.custom_gradient
    def function(*inputs):
        outputs, saved = forward(*inputs)

        def grad(*args, upstream=None):  # TensorFlow passes it positionally, JAX by name
            return backward(saved, args[0] if upstream is None else upstream)

        return outputs, grad

    return function


def compiled(fn):
    """`fn`, a function of tensors, compiled as one XLA computation inside TensorFlow's graph
    runtime (`tf.function(jit_compile=True)`): its elementwise operations run fused, in one
    pass over memory, where the runtime would run each as a pass of its own. It is traced for
    shapes as general as the calls allow (`reduce_retracing`), not once per batch size. On
    JAX, whose steps XLA compiles whole, `fn` itself."""
    if keras.backend.backend() != "tensorflow":
        return fn
    # The backend's own compiler, imported on that backend only.
    import tensorflow as tf

    return tf.function(fn, jit_compile=True, autograph=False, reduce_retracing=True)


def sequential_scan(fn, init, count):
    """`carry, y = fn(carry, i)` for `i` in `range(count)`, one iteration after the other:
    returns the last carry and every `y` stacked on a new first axis (`jax.lax.scan` over
    `arange(count)`).

    Args:
        fn: a function of (carry, the iteration's index as an int32 scalar) returning (the new
            carry, of the same structure, shapes and dtypes; `y`, any structure of tensors of
            the same shape in every iteration).
        init: a structure (tuple, list, dict) of tensors, possibly empty: the first carry.
        count: int. Iterations.

    On JAX this is `keras.ops.scan`. TensorFlow's `keras.ops.scan` stacks `y` in arrays shaped
    like the carry, and its `keras.ops.fori_loop` lets up to 10 iterations run at once, each
    with its own intermediates alive; here a `tf.while_loop` runs one iteration at a time
    (`parallel_iterations=1`) and collects `y` in TensorArrays (eagerly, a Python loop).
    """
    if keras.backend.backend() != "tensorflow":
        return ops.scan(fn, init, ops.arange(count, dtype="int32"))
    # The backend's own loop, imported on that backend only: a JAX process never loads it.
    import tensorflow as tf

    if tf.executing_eagerly():  # eager operations run in turn anyway
        carry, ys = init, []
        for i in range(count):
            carry, y = fn(carry, tf.constant(i, tf.int32))
            ys.append(y)
        return carry, tree.map_structure(lambda *y: tf.stack(y), *ys)
    # The shapes of `y`, from a trace of one iteration whose result nothing uses (a function
    # runs only what its outputs need): every iteration runs inside the loop, so none starts
    # before the loop's inputs exist.
    first = fn(init, tf.constant(0, tf.int32))[1]
    arrays = [tf.TensorArray(y.dtype, size=count, element_shape=y.shape)
              for y in tree.flatten(first)]

    def body(i, carry, arrays):
        carry, y = fn(carry, i)
        return i + 1, carry, [a.write(i, t) for a, t in zip(arrays, tree.flatten(y))]

    _, carry, arrays = tf.while_loop(lambda i, *_: i < count, body,
                                     (tf.constant(0, tf.int32), init, arrays),
                                     parallel_iterations=1)
    return carry, tree.pack_sequence_as(first, [a.stack() for a in arrays])


def after(tensors, dependency):
    """`tensors` as they are, for operations that must not start before `dependency` exists.

    TensorFlow's graph runtime runs each operation as soon as its inputs exist: a backward
    pass's operation that reads only forward tensors (a transposed copy, a slice) would run
    during the forward pass and hold its result until the backward pass. There the tensors
    pass through identities (no copy) that wait for `dependency`; eagerly and on JAX (XLA
    schedules the whole program) they are returned unchanged.

    Args:
        tensors: a structure of tensors.
        dependency: a tensor or structure of tensors, e.g. the upstream gradient.
    """
    if keras.backend.backend() != "tensorflow":
        return tensors
    # The backend's own control dependencies, imported on that backend only.
    import tensorflow as tf

    if tf.executing_eagerly():
        return tensors
    with tf.control_dependencies(tree.flatten(dependency)):
        return tree.map_structure(tf.identity, tensors)


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


def remat_call(layer, forward, x):
    """`forward(x)`, the computation of `layer` (whose sublayers' weights and dropout seeds it
    reads), keeping only `x` for the backward pass and recomputing the rest there
    (`keras.remat`), with the same dropout masks as the forward pass.

    TensorFlow's recompute_grad re-runs the function after the seed generators have advanced,
    which would draw new masks (and give wrong gradients), so each recomputation first restores
    the seeds of the forward pass. JAX's checkpoint traces a pure function: the seeds go in and
    the advanced seeds come out (assigning them inside would leak its tracers), and the
    recomputation replays the same seeds by construction.
    """
    states = random_states(layer)
    if not states:
        return keras.remat(forward)(x)
    if keras.backend.backend() != "jax":
        seeds = [ops.copy(state.value) for state in states]  # the values, not the variables

        def seeded_forward(x):
            for state, seed in zip(states, seeds):
                state.assign(seed)
            return forward(x)

        return keras.remat(seeded_forward)(x)

    # A variable that a StatelessScope does not map reads as its stored value, not as the
    # value of an enclosing scope (Keras' JAX trainer runs the step in one): the weights are
    # mapped to their current values as well.
    weights = [w.value for w in layer.weights]

    def pure_forward(x, seeds):
        return stateless_call(lambda: forward(x), layer.weights, weights, states, seeds)

    outputs, advanced = keras.remat(pure_forward)(x, [state.value for state in states])
    for state, value in zip(states, advanced):
        state.assign(value)
    return outputs


def scan_layers(layers, x, training):
    """Applies `layers` in turn to `x` as one traced layer scanned over their stacked weights
    (big_vision's scanned layout): `layers[0]`'s computation with each layer's weights. Dropout
    masks come from `layers[0]`'s seed generators, advanced from layer to layer. For layers
    whose weights have the same shapes and dtypes, on JAX (`keras_vit.routes.encoder` checks).
    """
    template = layers[0]
    # Each weight stacked over the layers: [len(layers), *shape].
    stacked = [ops.stack([layer.weights[j].value for layer in layers])
               for j in range(len(template.weights))]
    seeds = random_states(template)

    def body(carry, layer_weights):
        x, seed_values = carry
        y, seed_values = stateless_call(lambda: template(x, training=training),
                                        template.weights, layer_weights, seeds,
                                        seed_values)  # y = [B, N, D]
        return (y, seed_values), None

    (x, seed_values), _ = ops.scan(body, (x, [v.value for v in seeds]), stacked)
    for variable, value in zip(seeds, seed_values):
        variable.assign(value)
    return x


# --------------------------------------------------------------------------------------------
# Attention.


def attention_probabilities(query, key, bias=None, narrow=False):
    """softmax(q k^T / sqrt(k) + bias) per head: `[B, N, h, k]` query and key ->
    `[B, h, N, N]`.

    The softmax runs in float32 at least, so that mixed precision does not overflow; the
    result has the query's dtype, through `softmax_as` where `narrow`, else through autodiff.
    """
    logits = _logits(_scaled(query), key)
    if bias is not None:
        logits = logits + ops.cast(bias, "float32")  # logits = [B, h, N, N]
    if narrow:
        return softmax_as(logits, query.dtype)
    return ops.cast(ops.softmax(logits, axis=-1), query.dtype)


def _scaled(query):
    """The queries times 1 / sqrt(k), in their dtype."""
    return query * ops.cast(1.0 / math.sqrt(query.shape[-1]), query.dtype)


def _logits(scaled, key):
    """The logits of the scaled queries and the keys, `[B, N, h, k]` each, in float32:
    `[B, h, N, N]`."""
    return ops.cast(ops.einsum("bqhk,bshk->bhqs", scaled, key), "float32")


def softmax_as(logits, dtype):
    """`softmax(logits, axis=-1)` of float32 logits, computed in float32 and returned in
    `dtype`. For another `dtype` (16-bit in mixed precision), the backward pass keeps only
    that result (which the product with the values keeps too, without attention dropout) and
    computes softmax's gradient from it in float32, `(g - sum(g p)) p`; autodiff would keep
    the float32 probabilities as well."""
    if keras.backend.standardize_dtype(dtype) == logits.dtype:
        return ops.softmax(logits, axis=-1)

    def forward(logits):
        probs = ops.cast(ops.softmax(logits, axis=-1), dtype)
        return probs, probs

    def backward(probs, g):
        p = ops.cast(after(probs, g), "float32")  # in the backward pass, not before
        g = ops.cast(g, "float32")
        return (g - ops.sum(g * p, axis=-1, keepdims=True)) * p

    return with_gradient(forward, backward)(logits)


def fused_attention(query, key, value, bias=None):
    """softmax(q k^T / sqrt(k) + bias) v as one operation, `keras.ops.dot_product_attention`,
    which a backend may run as one kernel (cuDNN's flash attention under JAX on a GPU)."""
    return ops.dot_product_attention(
        query, key, value, bias=None if bias is None else ops.cast(bias, query.dtype),
        scale=1.0 / math.sqrt(query.shape[-1]))


# Queries per block of the memory-efficient attention, at most: the sequence is cut into
# the fewest blocks of at most this many, all of one size (the last padded).
ATTENTION_BLOCK = 128


class _Blocks:
    """How `memory_efficient_attention` cuts N queries: `count` blocks of `size` rows each
    (the last padded to `count * size`), with the slicing and joining of them."""

    def __init__(self, length, block):
        self.length = length
        self.count = -(-length // block)
        self.size = -(-length // self.count)  # queries per block

    def heads_first(self, x, padded=False):  # [B, N, h, ...] -> [B, h, N, ...], rows padded
        x = ops.transpose(x, (0, 2, 1, 3))
        padding = [(0, 0), (0, 0), (0, self.count * self.size - self.length), (0, 0)]
        return ops.pad(x, padding) if padded else x

    def rows(self, x, i):  # block i of `x` along axis 2: [B, h, size, ...]
        if self.count == 1:
            return x
        starts = [0] * len(x.shape)
        starts[2] = i * self.size
        sizes = list(ops.shape(x))
        sizes[2] = self.size
        return ops.slice(x, starts, sizes)

    def joined(self, blocks):  # [count, B, h, size, ...] -> [B, h, N', ...], padding kept
        x = ops.moveaxis(blocks, 0, 2)  # [B, h, count, size, ...]
        return ops.reshape(x, (*ops.shape(x)[:2], self.count * self.size, *ops.shape(x)[4:]))

    def each(self, fn):
        """`fn(i)` for every block in turn, its results stacked on a new first axis."""
        if self.count == 1:  # no loop
            return tree.map_structure(lambda y: y[None], fn(0))
        return sequential_scan(lambda carry, i: (carry, fn(i)), (), self.count)[1]


def _block_logits(blocks, q, k, i):
    """The scaled logits of block i of the heads-first queries, in float32: [B, h, size, N]."""
    return ops.cast(ops.einsum("bhqk,bhsk->bhqs", _scaled(blocks.rows(q, i)), k), "float32")


def _blockwise_forward(blocks, q, k, v):
    """The heads-first context `[B, h, N', k]` and each row's log-sum-exp of logits
    `[B, h, N', 1]`, one block of queries after the other."""

    def block(i):
        logits = _block_logits(blocks, q, k, i)
        peak = ops.max(logits, axis=-1, keepdims=True)  # [B, h, size, 1]
        weights = ops.exp(logits - peak)
        total = ops.sum(weights, axis=-1, keepdims=True)
        # The context of the unnormalised weights, then divided: the division runs on
        # `[B, h, size, k]`, not on the probabilities' `[B, h, size, N]`.
        context = ops.einsum("bhqs,bhsk->bhqk", ops.cast(weights, q.dtype), v)
        context = ops.cast(ops.cast(context, "float32") / total, q.dtype)  # [B, h, size, k]
        return context, peak + ops.log(total)

    contexts, log_sums = blocks.each(block)
    return blocks.joined(contexts), blocks.joined(log_sums)


def _blockwise_backward(blocks, saved, upstream):
    """The gradients of the heads-first q, k, v from the upstream gradient of the context,
    each block's probabilities recomputed from its logits and log-sum-exp."""
    q, k, v, context, log_sums = saved
    dtype = q.dtype
    q, k, v, log_sums = after((q, k, v, log_sums), upstream)
    g = ops.cast(upstream, dtype)  # [B, h, N', k]
    # The rows' sum of upstream gradient times context: softmax's backward term.
    g_dot_o = ops.sum(ops.cast(upstream, "float32") * ops.cast(context, "float32"), -1,
                      keepdims=True)  # [B, h, N', 1]
    scale = 1.0 / math.sqrt(q.shape[-1])

    def block_grads(i):  # block i's d_q and its terms of d_k and d_v (float32)
        probs = ops.exp(_block_logits(blocks, q, k, i) - blocks.rows(log_sums, i))
        g_block = blocks.rows(g, i)  # [B, h, size, k]
        d_v = ops.cast(ops.einsum("bhqs,bhqk->bhsk", ops.cast(probs, dtype), g_block),
                       "float32")
        d_probs = ops.cast(ops.einsum("bhqk,bhsk->bhqs", g_block, v), "float32")
        # The gradient of the logits before their scale, which multiplies the `[.., k]`
        # products below instead of the `[.., N]` logits.
        d_logits = ops.cast(probs * (d_probs - blocks.rows(g_dot_o, i)), dtype)
        d_k = ops.cast(ops.einsum("bhqs,bhqk->bhsk", d_logits, blocks.rows(q, i)), "float32")
        d_q = ops.einsum("bhqs,bhsk->bhqk", d_logits, k)
        return d_k * scale, d_v, d_q * ops.cast(scale, dtype)

    # The first block starts the sums (zeros to start from would not wait for `upstream`).
    d_k, d_v, d_q = block_grads(0)
    if blocks.count > 1:
        def step(carry, i):
            d_k, d_v, d_q = block_grads(i + 1)
            return (carry[0] + d_k, carry[1] + d_v), d_q

        (d_k, d_v), rest = sequential_scan(step, (d_k, d_v), blocks.count - 1)
        d_q = ops.concatenate([d_q[None], rest], axis=0)
    else:
        d_q = d_q[None]
    return tuple(ops.cast(grad, x.dtype)
                 for grad, x in zip((blocks.joined(d_q), d_k, d_v), (q, k, v)))


def memory_efficient_attention(query, key, value, block=ATTENTION_BLOCK):
    """softmax(q k^T / sqrt(k)) v per head over blocks of queries, one block after the other,
    with a custom gradient that keeps only the queries, keys, values, the context and each
    query's log-sum-exp of logits, and recomputes each block's probabilities in the backward
    pass (Rabe and Staats 2021, "Self-attention does not need O(n^2) memory"; the backward of
    FlashAttention, Dao et al. 2022). At most one block's `[B, h, block, N]` logits are alive.

    Matrix products run in the query's dtype and the softmax, its statistics and the
    accumulated gradients in float32, as in `attention_probabilities`.

    Every operation of the backward pass waits for the upstream gradient (`after`), so that a
    graph runtime cannot run one (a transposed copy, the first block's probabilities) during
    the forward pass and hold its result until the backward pass.

    Args:
        query, key, value: `[B, N, h, k]`, N known when traced.
        block: int. Queries per block, at most; with N or more, one block and no loop.

    Returns:
        The context `[B, N, h, k]`, in the query's dtype.
    """
    blocks = _Blocks(query.shape[1], block)

    def forward(q, k, v):  # heads first, the queries padded
        context, log_sums = _blockwise_forward(blocks, q, k, v)
        return context, (q, k, v, context, log_sums)

    attend = with_gradient(forward, lambda saved, g: _blockwise_backward(blocks, saved, g))
    context = attend(blocks.heads_first(query, padded=True), blocks.heads_first(key),
                     blocks.heads_first(value))  # [B, h, N', k]
    return ops.transpose(context[:, :, :blocks.length], (0, 2, 1, 3))  # [B, N, h, k]


def recomputed_attention(query, key, value):
    """softmax(q k^T / sqrt(k)) v, the products of `attention_probabilities` (bit for bit),
    whose backward pass recomputes the probabilities from the queries and keys instead of
    keeping them (selective activation recomputation, Korthikanti et al. 2022): the forward
    pass keeps no `[B, h, N, N]` tensor for the backward pass, which holds one layer's at a
    time while it runs. The backward pass computes what autodiff of the products computes:
    the softmax's gradient in float32 from its float32 probabilities.

    Args:
        query, key, value: `[B, N, h, k]`.

    Returns:
        The context `[B, N, h, k]`, in the query's dtype.
    """

    def forward(q, k, v):
        probs = attention_probabilities(q, k)  # [B, h, N, N]
        return ops.einsum("bhqs,bshk->bqhk", probs, v), (q, k, v)

    def backward(saved, upstream):
        q, k, v = after(saved, upstream)  # in the backward pass, not before
        g = ops.cast(upstream, q.dtype)  # [B, N, h, k]
        scaled = _scaled(q)
        exact = ops.softmax(_logits(scaled, k), axis=-1)  # float32, as in the forward pass
        probs = ops.cast(exact, q.dtype)
        d_v = ops.einsum("bhqs,bqhk->bshk", probs, g)
        d_probs = ops.cast(ops.einsum("bqhk,bshk->bhqs", g, v), "float32")
        d_logits = ops.cast((d_probs - ops.sum(d_probs * exact, axis=-1, keepdims=True))
                            * exact, q.dtype)
        d_q = _scaled(ops.einsum("bhqs,bshk->bqhk", d_logits, k))
        d_k = ops.einsum("bhqs,bqhk->bshk", d_logits, scaled)
        return d_q, d_k, d_v

    return with_gradient(forward, backward)(query, key, value)


# --------------------------------------------------------------------------------------------
# GELU and LayerNorm whose backward pass keeps only their input.


def backward_dtype(dtype):
    """The dtype a recomputing backward pass computes in: float32, or `dtype` if wider."""
    return keras.backend.result_type(dtype, "float32")


def gelu_and_derivative(x, approximate):
    """(GELU of `x` in its dtype, d gelu(x) / dx) from one `tanh` (or `erfc`) of `x`,
    computed in float32 (or `x`'s dtype if wider, `backward_dtype`) in the order of
    `tf.nn.gelu` (whose float32 values it gives bit for bit). With t = tanh(c (x + a x^3)),
    c = sqrt(2 / pi), a = 0.044715, the derivative is
    `0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)`; exact: `Phi(x) + x phi(x)`."""
    x32 = ops.cast(x, backward_dtype(x.dtype))
    if approximate:
        c = 0.7978845608028654  # sqrt(2 / pi)
        t = ops.tanh(c * (x32 + 0.044715 * ops.power(x32, 3)))
        value = 0.5 * x32 * (1.0 + t)
        derivative = 0.5 * (1.0 + t) + 0.5 * x32 * (1.0 - t * t) * c * (
            1.0 + 3.0 * 0.044715 * x32 * x32)
    else:
        e = ops.erfc(-x32 * 0.7071067811865476)  # twice the normal distribution's CDF
        value = 0.5 * x32 * e
        derivative = 0.5 * e + x32 * ops.exp(-0.5 * x32 * x32) / math.sqrt(2.0 * math.pi)
    return ops.cast(value, x.dtype), derivative


def _gelu_value_and_gradient(x, g, approximate):
    """GELU of `x` in its dtype (`gelu_and_derivative`) and the gradient of `x` from `g`,
    that of GELU's output, computed in `backward_dtype` and returned in `x`'s dtype."""
    value, derivative = gelu_and_derivative(x, approximate)
    return value, ops.cast(ops.cast(g, derivative.dtype) * derivative, x.dtype)


def _gelu_gradient(x, g, approximate):
    """The gradient alone of `_gelu_value_and_gradient` (the value it does not return, a
    graph or XLA leaves uncomputed)."""
    return _gelu_value_and_gradient(x, g, approximate)[1]


@functools.lru_cache(maxsize=None)
def _gelu_backward(function, approximate, dtype):
    """`function` (`_gelu_gradient` or `_gelu_value_and_gradient`) for `approximate`, for
    inputs of `dtype`: `compiled` where the backward pass computes in a wider dtype than the
    input (16-bit inputs), so that its casts and elementwise operations run as one pass; for
    float32 inputs as it is, the operations of the forward pass's GELU."""
    bound = functools.partial(function, approximate=approximate)
    return compiled(bound) if backward_dtype(dtype) != dtype else bound


def recomputed_gelu(x, approximate):
    """`keras.activations.gelu(x, approximate)` whose backward pass keeps only `x` and
    computes the derivative from it (`gelu_and_derivative`)."""

    def forward(x):
        return keras.activations.gelu(x, approximate=approximate), x

    def backward(x, g):
        x = after(x, g)  # not before the backward pass
        dtype = keras.backend.standardize_dtype(x.dtype)
        return _gelu_backward(_gelu_gradient, approximate, dtype)(x, g)

    return with_gradient(forward, backward)(x)


def recomputed_gelu_dense(x, kernel, bias, approximate):
    """`gelu(x) @ kernel + bias`: GELU and the Dense after it (`keras.layers.Dense`'s
    product, then its bias), whose backward pass keeps only `x` and computes from it GELU
    again, for the kernel's gradient, and GELU's derivative (`gelu_and_derivative`): the
    hidden activation between the two is not kept for the backward pass. The forward pass is
    `keras.activations.gelu` and the Dense's own operations.

    Args:
        x: `[..., M]`, the first Dense's output.
        kernel: `[M, D]`, bias: `[D]`, in `x`'s dtype.
        approximate: bool. The tanh approximation of GELU, else the exact one.
    """

    def forward(x, kernel, bias):
        hidden = keras.activations.gelu(x, approximate=approximate)
        return ops.add(ops.matmul(hidden, kernel), bias), (x, kernel)

    def backward(saved, g):
        x, kernel = after(saved, g)  # in the backward pass, not before
        d_hidden = ops.matmul(g, ops.transpose(kernel))  # d_hidden = [..., M]
        dtype = keras.backend.standardize_dtype(x.dtype)
        hidden, d_x = _gelu_backward(_gelu_value_and_gradient, approximate, dtype)(x, d_hidden)
        rows, g_rows = ops.reshape(hidden, (-1, x.shape[-1])), ops.reshape(g, (-1, g.shape[-1]))
        d_kernel = ops.matmul(ops.transpose(rows), g_rows)  # [M, D]
        return d_x, d_kernel, ops.sum(g_rows, axis=0)

    return with_gradient(forward, backward)(x, kernel, bias)


def _layer_norm_backward(epsilon, saved, upstream):
    """The gradients of LayerNorm's input, scale and offset, its statistics recomputed."""
    x, gamma, beta = saved
    g = ops.cast(upstream, "float32")
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


def recomputed_layer_norm(layer, x):
    """`layer(x)` for a `keras.layers.LayerNormalization` over the last axis with scale and
    center, by Keras' formula in float32 at least, in the layer's compute dtype, whose
    backward pass keeps only `x` and recomputes the statistics."""

    def forward(x, gamma, beta):
        y = ops.layer_normalization(x, gamma, beta, epsilon=layer.epsilon)
        return ops.cast(y, layer.compute_dtype), (x, gamma, beta)

    def backward(saved, g):
        return _layer_norm_backward(layer.epsilon, saved, g)

    return with_gradient(forward, backward)(x, layer.gamma.value, layer.beta.value)


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
    return with_gradient(lambda x: (x, None), lambda _, g: g / (1 + 0 * g))(x)
