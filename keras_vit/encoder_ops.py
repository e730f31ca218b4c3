"""Running a stack of layers: recomputing a block in the backward pass with the same dropout
masks (`remat_call`), and scanning one traced block over stacked weights (`scan_layers`): the
encoder's structure options (`keras_vit.encoder`); and a loop whose iterations run one after
the other on every backend (`sequential_scan`, for the memory-efficient attention of
`keras_vit.routes`) and tensors read only after another exists (`after`, for its backward
pass). The backend-specific code lives here, so that the layers hold no backend
checks.
"""

import keras
from keras import ops
from keras import tree


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
