"""Every use of a private Keras or TensorFlow member, each behind a fallback to the public API.

The rest of the package uses public API only (`tests/test_structure.py` scans the package's
source for private members of other libraries and fails on any that is used elsewhere or not
listed here). Each piece names the members it relies on, why (an upstream bug, or a benefit
measured in BENCHMARKS.md), and what happens without them. `missing_private_members()` says
which the installed Keras and TensorFlow lack, and `tests/test_framework.py` fails loudly on
any, so that a framework release that changes them is noticed at once instead of making
training silently slower or wrong.

- `symbolic_build`: builds the optimizer, loss and metric state before the first training
  step (without it Keras creates them inside the first traced step, and TensorFlow traces
  that step twice), the loss and metrics from a functional model's output instead of a trace
  of its forward pass (`_compile_loss`, `_compile_metrics`). Fallback: build the optimizer
  state only.
- `FirstValues`: a model built to be loaded is created without running its variables'
  initializers (Keras' deferred initialisation), and each variable the checkpoint covers gets
  the file's value as its first (`Variable._initialize`); the others run their initializers
  (`Variable._deferred_initialize`), and Keras' list of variables waiting for a value
  (`global_state`'s "uninitialized_variables") forgets them all. Fallback: variables are
  created with their initial values, and the checkpoint's are assigned over them.
- `op_determinism_enabled`: whether `tf.config.experimental.enable_op_determinism()` is on,
  under which Keras turns XLA off. Fallback: False.
- `reduce_gradients_before_clipping`, `enable_multiworker_fit`: Keras 3 bugs under
  tf.distribute (see each). Fallback: Keras' own behaviour, with a warning.
- `UpdateStepOverride`, `optimizer_strategy`, `uses_weight_decay`, `adam_slots`: the hook and
  the Adam state through which `keras_vit.training.adam` replaces Keras' Adam(W) update step
  with its fused one (`keras_vit.training.AdamW`). Fallback: Keras' own update.
"""

import contextlib
import functools
import importlib
import types
import warnings

import keras

# Every private member used below: (owner, attribute). An owner is a class, a module path, or
# one of the instances `_instances()` builds (attributes Keras sets on a built object).
PRIVATE_MEMBERS = (
    (keras.Model, "_symbolic_build"),
    (keras.Model, "_maybe_symbolic_build"),
    (keras.optimizers.Optimizer, "_all_reduce_sum_gradients"),
    ("optimizer", "_trainable_variables"),
    (keras.optimizers.AdamW, "_backend_update_step"),
    (keras.optimizers.AdamW, "_apply_weight_decay"),
    (keras.optimizers.AdamW, "_use_weight_decay"),
    (keras.optimizers.AdamW, "_get_variable_index"),
    ("optimizer", "_momentums"),
    ("optimizer", "_velocities"),
    ("optimizer", "_distribution_strategy"),
    ("compiled_model", "_compile_loss"),
    ("compiled_model", "_compile_metrics"),
    ("tensorflow.python.framework.config", "is_op_determinism_enabled"),
    (keras.Variable, "_initialize"),
    (keras.Variable, "_deferred_initialize"),
    ("keras.src.backend.common.global_state", "get_global_attribute"),
    ("keras.src.backend.common.global_state", "set_global_attribute"),
)


def private_names():
    """What `PRIVATE_MEMBERS` names, as a scan of the source finds it: the attribute's name,
    or for a member of a private module, the module's dotted name."""
    return {owner if isinstance(owner, str) and "." in owner else name
            for owner, name in PRIVATE_MEMBERS}


def _instances():
    """Built framework objects whose instance attributes `PRIVATE_MEMBERS` names."""
    optimizer = keras.optimizers.AdamW()
    optimizer.build([keras.Variable([0.0])])
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return {"optimizer": optimizer, "compiled_model": model}


def _has(owner, name, instances):
    if isinstance(owner, str) and owner in instances:
        owner = instances[owner]
    elif isinstance(owner, str):
        try:
            owner = importlib.import_module(owner)
        except ImportError:
            return False
    return hasattr(owner, name)


def missing_private_members():
    """The private members this module relies on that the installed frameworks lack, as
    "owner.attribute" strings (empty when all are there)."""
    instances = _instances()
    return [f"{getattr(owner, '__name__', owner)}.{name}"
            for owner, name in PRIVATE_MEMBERS if not _has(owner, name, instances)]


def _warn_fallback(what):
    warnings.warn(f"keras_vit: this Keras/TensorFlow release lacks a private member that "
                  f"{what} uses; falling back to the public API.", RuntimeWarning, stacklevel=3)


def _needs_patch(obj, marker, privates, what):
    """Whether `obj` still needs the patch named `what`: not yet applied (`marker` unset),
    and the private members it uses are there (else a warning, and Keras' behaviour)."""
    if getattr(obj, marker, False):
        return False
    if not all(hasattr(obj, name) for name in privates):
        _warn_fallback(what)
        return False
    return True


# --------------------------------------------------------------------------------------------
# Start-up.


def symbolic_build(model, data_batch):
    """Builds `model`'s compiled loss, metrics and optimizer state from `data_batch`, an
    `(inputs, labels, sample_weights)` of symbolic tensors or arrays (Keras'
    `Model._symbolic_build`), so that the first training step traces once.

    Keras traces the model's forward pass to learn the structure and shapes of its
    predictions; a functional model that calls its graph as Keras does states them
    (`compute_output_spec` runs through the graph of layers without tracing), so for one that
    also computes its loss and metrics as Keras does, they are built from that first and the
    trace is left out."""
    if not hasattr(model, "_symbolic_build"):
        _warn_fallback("keras_vit.training.build_training_state")
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        return
    inputs, labels = data_batch[0], data_batch[1]
    as_keras = _computes_its_graph(type(model)) and all(
        getattr(type(model), name) is getattr(keras.Model, name)
        for name in ("compute_loss", "compute_metrics"))
    if as_keras and labels is not None:
        def spec(x):
            return keras.KerasTensor(x.shape, keras.backend.standardize_dtype(x.dtype))

        predictions = model.compute_output_spec(keras.tree.map_structure(spec, inputs))
        labels = keras.tree.map_structure(spec, labels)
        for compiled in (getattr(model, "_compile_loss", None),
                         getattr(model, "_compile_metrics", None)):
            if compiled is not None and not compiled.built:
                compiled.build(labels, predictions)
    model._symbolic_build(data_batch=data_batch)


def _computes_its_graph(cls):
    """Whether a model class's `call` gives its functional graph's outputs: Keras' own, or one
    that computes them by another route and says so (`COMPUTES_ITS_GRAPH = True`)."""
    return cls.call is _functional_call() or getattr(cls, "COMPUTES_ITS_GRAPH", False)


@functools.cache
def _functional_call():
    """`call` of Keras' functional models (the class `keras.Model(inputs, outputs)` makes)."""
    inputs = keras.Input((1,))
    return type(keras.Model(inputs, inputs)).call


def op_determinism_enabled():
    """Whether TensorFlow's op determinism is on (its getter is not public)."""
    try:
        config = importlib.import_module("tensorflow.python.framework.config")
    except ImportError:
        return False
    getter = getattr(config, "is_op_determinism_enabled", None)
    return bool(getter()) if getter else False


# --------------------------------------------------------------------------------------------
# Loading.

# Keras' list of the variables created without a value, in its global state.
_WAITING = "uninitialized_variables"


class FirstValues:
    """Variables that take their first value from a checkpoint instead of their initializer,
    so that a model built to be loaded does not first fill its weights with random values
    that the checkpoint then overwrites:

        with FirstValues() as first:
            with first.creating():
                model = build()  # its variables created without values
            first.assign(variable, value)  # each variable the checkpoint gives
        # on leaving: the others run their own initializers (unless the block raised), and
        # Keras forgets them all

    Keras' deferred initialisation: a variable created under
    `keras.StatelessScope(initialize_variables=False)` waits for a value in Keras' list;
    `_initialize(value)` gives it one. A new `creating()` block replaces the variables of the
    one before (a model built again): those still waiting are forgotten. Inside a caller's own
    `keras.StatelessScope`, the variables left on leaving stay in Keras' list, for that scope
    to initialise as it ends (a variable cannot be initialised inside one). Where this Keras
    lacks those members, variables are created with their initial values and `assign` assigns
    over them.
    """

    def __init__(self):
        self._deferred = _global_state() is not None and all(
            hasattr(keras.Variable, name) for name in ("_initialize", "_deferred_initialize"))
        if not self._deferred:
            _warn_fallback("keras_vit.from_pretrained")
        self._created = {}  # id -> variable, waiting for `assign` or its initializer

    def __enter__(self):
        return self

    @contextlib.contextmanager
    def creating(self):
        """The block's new variables wait for `assign` (or their initializer, on leaving)."""
        if not self._deferred:
            yield
            return
        _forget(list(self._created.values()))
        global_state = _global_state()
        before = {id(v) for v in global_state.get_global_attribute(_WAITING, [])}
        try:
            with keras.StatelessScope(initialize_variables=False):
                yield
        finally:
            self._created = {id(v): v for v in global_state.get_global_attribute(_WAITING, [])
                             if id(v) not in before}

    def assign(self, variable, value):
        """Gives `variable` `value` (an array of its shape): its first value where it waits for
        one, else an assignment."""
        if self._created.pop(id(variable), None) is None:
            variable.assign(value)
            return
        _forget([variable])
        variable._initialize(keras.ops.convert_to_tensor(value, dtype=variable.dtype))

    def __exit__(self, kind, error, traceback):
        waiting, self._created = list(self._created.values()), {}
        if kind is None and _global_state().get_global_attribute("stateless_scope") is not None:
            return False  # the caller's scope initialises them as it ends
        _forget(waiting)
        if kind is None:
            for variable in waiting:
                variable._deferred_initialize()
        return False


def _forget(variables):
    """Takes `variables` off Keras' list of variables waiting for a value."""
    if not variables:
        return
    global_state = _global_state()
    ids = {id(v) for v in variables}
    global_state.set_global_attribute(
        _WAITING, [v for v in global_state.get_global_attribute(_WAITING, []) if id(v) not in ids])


def _global_state():
    """Keras' global state module, or None where this Keras has not its accessors."""
    try:
        module = importlib.import_module("keras.src.backend.common.global_state")
    except ImportError:
        return None
    if all(hasattr(module, n) for n in ("get_global_attribute", "set_global_attribute")):
        return module
    return None


# --------------------------------------------------------------------------------------------
# tf.distribute.


def reduce_gradients_before_clipping(optimizer):
    """Makes a Keras optimizer all-reduce gradients across replicas before clipping them.

    Keras 3 clips each replica's gradients (`clipnorm`, `global_clipnorm`), then sums them in
    `_backend_update_step`: each replica's share is clipped on its own, and the result
    differs from one device. The paper's recipe clips the full-batch gradient at global norm
    1. This patches the optimizer instance (or the inner optimizer of a `LossScaleOptimizer`):
    in a replica context with several replicas, `apply` first sums the gradients across
    replicas, then runs Keras' own clipping, weight decay and update on the sum, skipping the
    second all-reduce. On one replica nothing changes.

    Returns:
        The optimizer.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not _needs_patch(inner, "_keras_vit_reduce_first", ("_all_reduce_sum_gradients",),
                        "reduce_gradients_before_clipping"):
        return optimizer
    keras_apply = inner.apply
    keras_all_reduce = inner._all_reduce_sum_gradients
    reduced = []  # non-empty while `apply` runs on already-reduced gradients

    import tensorflow as tf  # the patch is for Keras' TensorFlow trainer, on that backend only

    def apply(grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return keras_apply(grads, trainable_variables)
        # The variables Keras' own `apply` falls back to when none are given.
        variables = trainable_variables or getattr(inner, "_trainable_variables", None)
        if variables is None:
            _warn_fallback("reduce_gradients_before_clipping")
            return keras_apply(grads, trainable_variables)
        grads = [g for g, _ in keras_all_reduce(list(zip(grads, variables)))]
        reduced.append(True)
        try:
            return keras_apply(grads, trainable_variables)
        finally:
            reduced.pop()

    def all_reduce_sum_gradients(grads_and_vars):
        return list(grads_and_vars) if reduced else keras_all_reduce(grads_and_vars)

    inner.apply = apply
    inner._all_reduce_sum_gradients = all_reduce_sum_gradients
    inner._keras_vit_reduce_first = True
    return optimizer


def _logs_as_vectors(step):
    def wrapped(data):
        # Each scalar log becomes [1]: the multi-worker reduction over axis 0 then averages
        # the replicas' values instead of failing on a scalar.
        return {k: keras.ops.reshape(v, [1]) for k, v in step(data).items()}

    return wrapped


def enable_multiworker_fit(model):
    """Makes `model.fit` / `evaluate` work under multi-worker MirroredStrategy.

    Keras 3.15 `Model.fit` breaks under `MultiWorkerMirroredStrategy` with more than one worker
    (keras-team/keras#20585), in two places of its TensorFlow trainer:

    1. `_maybe_symbolic_build` reduces the first distributed batch with `strategy.reduce`
       eagerly, which the collective strategy cannot do ("Attempt to convert a value
       (PerReplica ...) to a Tensor");
    2. `reduce_per_replica` reduces the scalar logs with `strategy.reduce("MEAN", v, axis=0)`,
       and a scalar has no axis 0 ("Invalid reduction dimension 0 for input with 0
       dimensions").

    This fixes both on the model instance only: the symbolic build takes the first local
    replica's batch (only its shapes matter), and the train and test steps return their logs
    as `[1]` vectors, so that the reduction over axis 0 averages the replicas. Call it only
    for a model created under a multi-worker strategy.

    Returns:
        The model.
    """
    if not _needs_patch(model, "_keras_vit_multiworker",
                        ("_maybe_symbolic_build", "_symbolic_build"), "enable_multiworker_fit"):
        return model
    build_from_one_replica(model)
    model.train_step = _logs_as_vectors(model.train_step)
    model.test_step = _logs_as_vectors(model.test_step)
    model._keras_vit_multiworker = True
    return model


def build_from_one_replica(model):
    """Keras' `_maybe_symbolic_build` sums the first distributed batch over the replicas
    (`strategy.reduce`) only to learn its shapes: under any strategy with several replicas a
    first batch split unevenly (the last batch of a validation split, 26 and 25 images) fails
    there ("Inputs to operation AddN ... must have the same size and shape"), and the
    collective strategy cannot reduce eagerly at all. Here the symbolic build takes the first
    local replica's batch instead, on this model instance only.

    Returns:
        The model.
    """
    if not _needs_patch(model, "_keras_vit_one_replica_build",
                        ("_maybe_symbolic_build", "_symbolic_build"), "build_from_one_replica"):
        return model
    import tensorflow as tf  # the patch is for Keras' TensorFlow trainer, on that backend only

    strategy = model.distribute_strategy

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v,
                    batch,
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = types.MethodType(maybe_symbolic_build, model)
    model._keras_vit_one_replica_build = True
    return model


# --------------------------------------------------------------------------------------------
# The optimizer's update step (for the fused Adam update of `keras_vit.training.adam`).

# Keras' Adam(W) members an own update step relies on: the class's, and a built instance's.
_UPDATE_MEMBERS = ("_backend_update_step", "_apply_weight_decay", "_use_weight_decay",
                   "_get_variable_index")
_ADAM_STATE = ("_momentums", "_velocities")


class UpdateStepOverride:
    """A mixin for `keras.optimizers.Adam`/`AdamW` subclasses: Keras' update of all variables
    (its private `_backend_update_step`, and the weight decay `_apply_weight_decay` applies
    before it) replaced by the subclass's `fused_update_step(grads, variables, learning_rate)`
    wherever its `fuses_update()` is true and this Keras has the members that step reads
    (`adam_slots`, `uses_weight_decay`); elsewhere Keras' own update.
    """

    def _apply_weight_decay(self, variables):
        if not _takes_fused_update(self):
            super()._apply_weight_decay(variables)
        # else: the fused update step applies it, per variable

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not _takes_fused_update(self):
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        return self.fused_update_step(grads, trainable_variables, learning_rate)


def _takes_fused_update(optimizer):
    """Whether this Keras has the members the fused step uses, and `optimizer` fuses now."""
    return all(hasattr(keras.optimizers.AdamW, n) for n in _UPDATE_MEMBERS) \
        and all(hasattr(optimizer, n) for n in _ADAM_STATE) and optimizer.fuses_update()


def optimizer_strategy(optimizer):
    """The `tf.distribute` strategy `optimizer`'s variables were created under (Keras' private
    `_distribution_strategy`); the current strategy where Keras does not say."""
    import tensorflow as tf  # the strategies are TensorFlow's, on that backend only

    return getattr(optimizer, "_distribution_strategy", tf.distribute.get_strategy())


def uses_weight_decay(optimizer, variable):
    """Whether `optimizer`'s weight decay applies to `variable` (Keras' exclusions match the
    TensorFlow variable's full name)."""
    return optimizer._use_weight_decay(variable)


def adam_slots(optimizer, variable):
    """`(momentum, velocity)`: the Adam state variables of `variable` in a built `optimizer`."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]
