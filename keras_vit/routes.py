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
import warnings

import keras
from keras import ops

from keras_vit.devices import cpu_vendor, on_cpu
from keras_vit.implementations import (attention_probabilities, backward_dtype, fused_attention,
                                       gradient_barrier, memory_efficient_attention,
                                       recomputed_attention, recomputed_gelu,
                                       recomputed_gelu_dense,
                                       recomputed_layer_norm, remat_call,
                                       scan_layers)

# Every choice and its implementations; "auto" (or leaving it out) is the measured default.
CHOICES = {
    # How softmax(q k^T / sqrt(k)) v is computed: "products", the two matrix products with the
    # softmax between them, written out (`attention_probabilities`); "fused",
    # `keras.ops.dot_product_attention`, one operation that a backend may run as one kernel
    # (cuDNN flash attention under JAX on a GPU); "recompute", the products, whose backward
    # pass keeps only the queries, keys and values and recomputes the probabilities
    # (`recomputed_attention`): none is kept between the passes; "memory_efficient", blocks
    # of queries in turn, whose backward pass keeps only the queries, keys, values, the
    # context and each row's log-sum-exp and recomputes each block's probabilities
    # (`memory_efficient_attention`): no `[B, h, N, N]` tensor is ever whole.
    "attention": ("products", "fused", "recompute", "memory_efficient"),
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
    # the input and computes the derivative from it (for 16-bit inputs in float32, as one
    # compiled pass: `implementations.compiled`).
    "gelu": ("autodiff", "recompute"),
    # A block's LayerNorms in training (`layer_norm`): "autodiff", Keras' layer (whose
    # backward keeps its full-size intermediates), or "recompute", a custom gradient that keeps
    # only the input and recomputes the statistics.
    "layer_norm": ("autodiff", "recompute"),
    # Each encoder block in training (`encoder_block`): "none", its activations kept for the
    # backward pass, or "blocks", only its input kept and the rest recomputed there with the
    # forward pass's dropout masks (`remat_call`, `keras.remat`): less memory, more compute.
    "remat": ("none", "blocks"),
    # The encoder's blocks (`encoder`): "none", each block's layer in turn, or "blocks", one
    # traced block run over their stacked weights (`scan_layers`, big_vision's scanned
    # layout: one block to trace and compile instead of `num_layers`), on JAX.
    "scan": ("none", "blocks"),
    # The attention's softmax in training (`attention_probabilities`), computed in float32:
    # "autodiff", through the softmax and the cast to the computation's dtype (in mixed
    # precision the backward pass keeps the float32 probabilities beside the 16-bit ones), or
    # "narrow", a custom gradient that keeps only the probabilities in the computation's dtype
    # and computes softmax's gradient from them in float32 (`softmax_as`). In float32 the two
    # are the same computation. It applies where the products keep probabilities: the
    # "recompute" and "memory_efficient" attention routes keep none.
    "softmax": ("autodiff", "narrow"),
}
AUTO = "auto"

# The process's choices (`set_routes`) and those of the `use_routes` blocks around this call.
_PROCESS = {}
_BLOCK = contextvars.ContextVar("keras_vit_routes", default={})


def check_routes(routes):
    """Returns `routes` (a dict of `CHOICES` names to one of their implementations or "auto")
    as a plain dict, or raises naming the bad entry."""
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
    process's choices. A model's function traced inside keeps them. The `fit`, `evaluate` and
    `predict` of a `keras_vit.ViT` or a masked-patch pre-training model called inside also
    run their steps with them in a `tf.distribute` strategy's replica threads
    (`keras_vit.model.RoutedSteps`); another model's steps there see only `set_routes`."""
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
      JAX), "products" on a CPU (no fused kernel there: the fused operation was no faster).
      In training, "recompute" on an AMD CPU, on TensorFlow and on JAX (less peak memory,
      more at 577 tokens than at 197 and more in bfloat16 than in float32, for at most a few
      percent of the step; where it cannot apply, with attention dropout or a bias on the
      logits, the products run), else "products" (the fused operation's backward was slower,
      on a GPU and on a CPU; on an Intel Xeon recomputing cost more of a step already below
      timm's speed; on a GPU it was not measured). "memory_efficient" is chosen, not a
      default: its loops took more time than recomputing without one, for no less memory.
    - block_input: "barrier" in training on JAX with CPU devices (XLA's CPU backend otherwise
      recomputes the residual stream's gradient in every block's backward pass), else "plain".
    - mlp: "rows" at inference, "tokens" in training (XLA's training step was slower on rows).
    - gelu: "recompute" in training in float32 (less memory at the same speed; the Dense
      after it recomputes it too, `gelu_dense`), and in 16-bit training on an AMD CPU on
      TensorFlow (whose recomputation, in float32, runs as one compiled pass: less memory at
      the same speed); elsewhere "autodiff" in 16-bit precisions (not measured there).
    - layer_norm: "recompute" in training (less memory; in bfloat16 also faster).
    Both are "autodiff" at inference, which has no backward pass.
    - remat: "none" (recomputing every block met timm's training memory at 1.22x the step
      time: chosen where memory decides, not a default).
    - scan: "none" (scanning stacks the blocks' weights in every step: slower and larger on
      a CPU, with no shorter first step; chosen where XLA's compile time decides).
    - softmax: "autodiff" ("narrow" held less memory in bfloat16 training on a CPU, more at
      577 tokens than at 197, and its steps were as fast or slower: chosen where memory
      decides, not a default).
    """
    if name == "attention":
        if training:
            return "recompute" if _amd_cpu() else "products"
        return "products" if on_cpu() else "fused"
    if name == "block_input":
        jax_on_cpu = keras.backend.backend() == "jax" and on_cpu()
        return "barrier" if training and jax_on_cpu else "plain"
    if name == "mlp":
        return "tokens" if training else "rows"
    if name == "gelu":
        recompute = dtype == "float32" or _amd_cpu_on_tensorflow()
        return "recompute" if training and recompute else "autodiff"
    if name == "layer_norm":
        return "recompute" if training else "autodiff"
    if name in ("remat", "scan"):
        return "none"
    if name == "softmax":
        return "autodiff"
    raise ValueError(f"Unknown route choice {name!r}. Expected one of {', '.join(CHOICES)}.")


def _amd_cpu():
    """Whether the model runs on an AMD CPU, where recomputing the attention's probabilities
    in training was measured to pay, on TensorFlow and on JAX."""
    return on_cpu() and cpu_vendor() == "AuthenticAMD"


def _amd_cpu_on_tensorflow():
    """Whether the model runs on an AMD CPU on the TensorFlow backend, where the recomputing
    default of 16-bit training was measured to pay."""
    return keras.backend.backend() == "tensorflow" and _amd_cpu()


def route(name, training, dtype="float32"):
    """The implementation of choice `name` here and now: the chosen one (`use_routes`,
    `set_routes`), else the default for the mode and the computation's dtype."""
    chosen = chosen_routes().get(name)
    if chosen is not None:
        return chosen
    return default_route(name, bool(training), keras.backend.standardize_dtype(dtype))


# --------------------------------------------------------------------------------------------
# The dispatch: each piece of the model by the route chosen for it (the implementations are in
# `keras_vit.implementations`).


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
            dropout): the products compute them, whichever route is chosen.

    The fused, recomputing and memory-efficient routes drop nothing: with dropout on the
    probabilities in training, the products run. The recomputing and memory-efficient routes
    also take no bias (relative position embeddings), and the memory-efficient one needs the
    sequence length when the function is traced: else the products run. A route chosen with
    `use_routes` or `set_routes` says so once (a warning naming the reason); a default that
    cannot apply gives way to the products silently, as its definition says.

    Returns:
        The context `[B, N, h, k]`, or `(context, probabilities)`.
    """
    dropping = training and dropout is not None and dropout.rate > 0
    chosen = route("attention", training)
    reason = _why_not(chosen, dropping, bias, query.shape[1])
    if reason and chosen_routes().get("attention") is None:
        chosen = "products"  # the default where its route cannot apply: nothing to say
    elif reason:
        _fell_back(f"The {chosen!r} attention route cannot take {reason}: the products "
                   "(softmax(q k^T) v, every probability kept) run instead for these layers.")
        chosen = "products"
    if chosen == "fused" and not return_probabilities:
        return fused_attention(query, key, value, bias)
    if chosen == "recompute" and not return_probabilities:
        return recomputed_attention(query, key, value)
    if chosen == "memory_efficient" and not return_probabilities:
        return memory_efficient_attention(query, key, value)
    narrow = training and route("softmax", training, query.dtype) == "narrow"
    probs = attention_probabilities(query, key, bias, narrow)  # probs = [B, h, N, N]
    dropped = dropout(probs, training=training) if dropping else probs
    context = ops.einsum("bhqs,bshk->bqhk", dropped, value)  # context = [B, N, h, k]
    return (context, probs) if return_probabilities else context


def _why_not(chosen, dropping, bias, length):
    """Why the attention route `chosen` cannot compute this call, or None."""
    if chosen == "products":
        return None
    if dropping:
        return "dropout on the attention probabilities in training"
    if chosen in ("recompute", "memory_efficient") and bias is not None:
        return "a bias on the logits (relative position embeddings)"
    if chosen == "memory_efficient" and length is None:
        return "a sequence length unknown when traced"
    return None


# The messages of routes that could not apply, already given in this process: each is said
# once.
_FELL_BACK = set()


def _fell_back(message):
    """Says once per process that a chosen route cannot apply, why, and what runs instead."""
    if message in _FELL_BACK:
        return
    _FELL_BACK.add(message)
    warnings.warn(message, stacklevel=3)


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
    if training and route("gelu", training, x.dtype) == "recompute":
        return recomputed_gelu(x, approximate)
    return keras.activations.gelu(x, approximate=approximate)


def gelu_dense(dense, dropout, x, approximate, training=False):
    """`dense(dropout(gelu(x)))` for the MLP's `keras.layers.Dense` and `keras.layers.Dropout`
    after its first Dense. With GELU's route "recompute" in training, GELU's backward pass
    keeps only its input, and so does the Dense's (`recomputed_gelu_dense`) where nothing
    stands between them (no dropout) and the Dense is a plain one (no LoRA, quantization or
    activation, the computation's dtype, float32 or 16 bits): the MLP's hidden activation is
    not kept for the backward pass."""
    if training and route("gelu", training, x.dtype) == "recompute" and dropout.rate == 0 \
            and _plain_dense(dense, x.dtype) and backward_dtype(x.dtype) == "float32":
        return recomputed_gelu_dense(x, ops.cast(dense.kernel, x.dtype),
                                     ops.cast(dense.bias, x.dtype), approximate)
    return dense(dropout(gelu(x, approximate, training), training=training))


def _plain_dense(dense, dtype):
    """Whether `dense` computes `x @ kernel + bias` in `dtype`, and nothing else."""
    return (type(dense) is keras.layers.Dense and dense.use_bias and not dense.lora_enabled
            and dense.quantization_mode is None and dense.compute_dtype == dtype
            and dense.activation is keras.activations.linear)


def layer_norm(layer, x, training=False):
    """`layer(x)` for a `keras.layers.LayerNormalization` over the last axis with scale and
    center; in training, by the chosen route for its backward pass. Both routes compute
    Keras' formula in float32 at least and return the layer's compute dtype."""
    if training and route("layer_norm", training, x.dtype) == "recompute":
        return recomputed_layer_norm(layer, x)
    return layer(x)


def encoder_block(layer, forward, x, training=False):
    """`forward(x)`, the computation of the encoder block `layer`; in training, with only `x`
    kept for the backward pass where "blocks" is the chosen `remat` route."""
    if training and route("remat", training) == "blocks":
        return remat_call(layer, forward, x)
    return forward(x)


def encoder(blocks, x, training=False):
    """The encoder blocks `blocks` applied in turn to `x = [B, N, D]`: each layer in turn, or
    one traced block scanned over their stacked weights where "blocks" is the chosen `scan`
    route and it can apply (on JAX, more than one block, all with weights of the same shapes
    and dtypes); where it cannot, it says why once per process."""
    if route("scan", training) == "blocks":
        reason = _why_not_scan(blocks)
        if reason is None:
            return scan_layers(blocks, x, training)
        _fell_back(f"The 'blocks' scan route does not apply here: {reason}. The blocks run "
                   "in turn.")
    for block in blocks:
        x = block(x, training=training)
    return x


def _why_not_scan(blocks):
    """Why the blocks cannot run scanned (`scan_layers`), or None."""
    if keras.backend.backend() != "jax":
        return (f"it scans on JAX only, not on the {keras.backend.backend()} backend "
                "(TensorFlow cannot differentiate a scan under XLA, and its loop ran slower)")
    if len(blocks) < 2:
        return "the encoder has a single block"
    if len({tuple((tuple(v.shape), v.dtype) for v in block.weights) for block in blocks}) > 1:
        return ("the blocks' weights differ in shape or dtype (LoRA or quantization of some "
                "blocks)")
    return None


def block_input(x, training=False):
    """An encoder block's input as the block uses it: `x` itself in the forward pass; in
    training, through `gradient_barrier` where that is the chosen (or default) route."""
    if training and route("block_input", training) == "barrier":
        return gradient_barrier(x)
    return x
