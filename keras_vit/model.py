"""The Vision Transformer: `keras_vit.ViT(...)`, a functional `keras.Model` that owns its
configuration.

`ViT.__init__` checks the arguments, makes the layers and wires them as the paper's equations
(section 3.1):

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos         (1)  embedding, cls, posembed_input
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                        (2)  encoderblock_{l-1}
    z_l = MLP(LN(z'_l)) + z'_l                               (3)  encoderblock_{l-1}
    y = LN(z_L^0)                                            (4)  encoder_norm, pool, head

Layer names follow the official checkpoint (`embedding`, `cls`, `posembed_input`,
`encoderblock_{i}`, `encoder_norm`, `pre_logits`, `head`), so every intermediate is reachable
with `model.get_layer(name)`; `model.attention_model()` also returns every block's attention
probabilities, and `model.forward_intermediates(images, ...)` (timm's name and arguments) the
outputs of chosen blocks as feature maps for dense-prediction heads. With `scan=True` or
`remat=True` the blocks are sublayers of one `keras_vit.Encoder` layer named `Transformer`. `get_config()` holds the constructor's
arguments and the model's data config (`model.data_config`, always set): how the model runs
(`keras_vit.routes`) is not saved with it.
"""

import contextlib
import json
import threading

import keras

from keras_vit.checks import (check_bool, check_choice, check_fits_in_memory, check_heads,
                              check_positive_int, check_rate, to_pair)
from keras_vit import intermediates, routes
from keras_vit.encoder import Encoder
from keras_vit.flops import sequence_length, vit_params
from keras_vit.layer_config import checked_policy, sublayers
from keras_vit.layers import (CLASSIFIERS, GELU_APPROXIMATE, LAYER_NORM_EPSILON, ClassToken,
                              PatchEmbedding, TokenPooling, TransformerBlock)
from keras_vit.positions import (POSITION_RESIZES, AddPositionEmbs, AddPositionEmbs2D,
                                 AddSinCosPositionEmbs2D, NoPositionEmbs)
from keras_vit.preprocessing import IMAGE_CHANNELS, check_data_config, paper_data_config
from keras_vit.resnet import ResNet, resnet_args, resnet_stride

# The name of the `Encoder` layer of a `scan=True` or `remat=True` model: its variables' paths
# are then the checkpoint keys (`Transformer/encoderblock_{i}/...`).
ENCODER = "Transformer"
# `position_embedding` -> the layer `posembed_input` that adds it (paper appendix D.4, Table 8;
# "sincos_2d" from big_vision). "relative" adds nothing there: each block's attention learns
# the relative embeddings (`MultiHeadDotProductAttention(relative_positions=...)`).
POSITION_EMBEDDINGS = {
    "learned": AddPositionEmbs,
    "learned_2d": AddPositionEmbs2D,
    "sincos_2d": AddSinCosPositionEmbs2D,
    "none": NoPositionEmbs,
    "relative": NoPositionEmbs,
}
RELATIVE = "relative"
# Where a ViT keeps its data config (outside Keras' attribute tracking: it is a value).
_DATA_CONFIG_SLOT = "_keras_vit_data_config"
# Where a model keeps, per step kind, the thread that made its step function and the routes
# it saw then (`RoutedSteps`; outside Keras' attribute tracking: values).
_STEP_ROUTES_SLOT = "_keras_vit_step_routes"
# Where a ViT keeps the models `forward_intermediates` made (a cache, not tracked by Keras).
_INTERMEDIATES_SLOT = "_keras_vit_intermediates"
# The arguments of the layouts keras_vit 0.4 saved execution choices in (the blocks in one
# `Encoder` layer): a model holds them only where they are True.
LAYOUT_ARGUMENTS = ("scan", "remat")
# Bytes a float32 weight or activation takes.
FLOAT32_BYTES = 4


class RoutedSteps:
    """A `keras.Model` mixin whose training, evaluation and prediction steps run with the
    routes (`keras_vit.routes`) chosen where their step function was made.

    A `tf.distribute` strategy runs each replica's step in a thread of its own, which does not
    see the `routes.use_routes` blocks of the thread that called `fit`, `evaluate` or
    `predict`: the routes that thread saw when it made the step function (every choice, "auto"
    included) are chosen again around each step run in another thread. In the thread that
    made it, its own blocks hold, as for any call.
    """

    def make_train_function(self, force=False):
        self._note_routes("train")
        return super().make_train_function(force)

    def make_test_function(self, force=False):
        self._note_routes("test")
        return super().make_test_function(force)

    def make_predict_function(self, force=False):
        self._note_routes("predict")
        return super().make_predict_function(force)

    def train_step(self, *args, **kwargs):
        with self._noted_routes("train"):
            return super().train_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        with self._noted_routes("test"):
            return super().test_step(*args, **kwargs)

    def predict_step(self, *args, **kwargs):
        with self._noted_routes("predict"):
            return super().predict_step(*args, **kwargs)

    def _note_routes(self, step):
        chosen = routes.chosen_routes()
        noted = {name: chosen.get(name, routes.AUTO) for name in routes.CHOICES}
        slots = self.__dict__.setdefault(_STEP_ROUTES_SLOT, {})  # not tracked by Keras
        slots[step] = (threading.get_ident(), noted)

    def _noted_routes(self, step):
        thread, noted = self.__dict__.get(_STEP_ROUTES_SLOT, {}).get(step, (None, None))
        if noted is None or thread == threading.get_ident():
            return contextlib.nullcontext()
        return routes.use_routes(**noted)


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(RoutedSteps, keras.Model):
    """A Vision Transformer: a functional `keras.Model` that keeps the arguments it was built
    from (`get_config()`, `keras_vit.vit_config(model)`) and is rebuilt from them on loading.

    Args:
        image_size: int or (height, width). Input resolution; both sides must be divisible by
            the patch size. Defaults to 224.
        patch_size: int or (height, width). Patch size in pixels. Defaults to 16.
        hidden_size: int. Transformer width D. Defaults to 768.
        num_layers: int. Number of encoder blocks. Defaults to 12.
        num_heads: int. Attention heads; must divide `hidden_size`. Defaults to 12.
        mlp_dim: int. MLP hidden width. Defaults to 3072.
        num_classes: int. Size of the classification head. Defaults to 1000.
        classifier: str. "token" (class token) or "gap" (mean of the patch tokens, no class
            token). Defaults to "token".
        representation_size: int or None. If set, a `pre_logits` Dense + tanh of this width
            before the head. Defaults to None.
        dropout_rate: float. Dropout after the position embeddings, attention and MLP.
            Defaults to 0.
        attention_dropout_rate: float. Dropout on the attention probabilities. Defaults to 0.
        include_top: bool. If False, the model returns the pooled representation (after
            `pre_logits` if present) instead of logits. Defaults to True.
        gelu_approximate: bool. Tanh-approximate GELU (Flax `nn.gelu`, used to train the
            official checkpoints) if True; exact GELU if False. Defaults to True.
        resnet: None, or a dict of `keras_vit.ResNet` arguments (e.g.
            `{"num_layers": (3, 4, 9)}`) for a hybrid: the patches are then cut from the
            ResNet's feature map (paper section 3.1), and `patch_size` counts feature-map
            cells. Defaults to None (patches of pixels).
        layer_norm_epsilon: float. Epsilon of every LayerNorm. Defaults to 1e-6, as the
            official Flax code (transformers' ViT checkpoints use 1e-12).
        dynamic_image_size: bool. If True, the model takes images of any size whose sides are
            multiples of the patch size (for a hybrid: whose ResNet feature map's are), and
            resizes the position embedding, learned at `image_size`, to each input's patch
            grid in the graph, with the interpolation of the official load-time resize (as
            timm's `dynamic_img_size`). One compiled function per input size under XLA.
            Defaults to False (inputs of `image_size` only).
        qkv_bias: bool. Whether the attention's query, key and value have biases. Defaults to
            True (False: timm's and transformers' `qkv_bias=False` models).
        class_token: bool or None. Whether the sequence has a class token. None (the
            default) means `classifier == "token"`; True with `classifier="gap"` keeps a class
            token beside the average of the patch tokens (timm's `global_pool="avg"` with a
            class token, as MAE's fine-tuned models).
        fc_norm: bool. If True, the final LayerNorm (`fc_norm`) normalises the pooled
            features instead of the token sequence (timm's `fc_norm`, for "gap" models).
            Defaults to False.
        remat: bool. The layout 0.4 saved recomputation in: the blocks live in one
            `keras_vit.Encoder` layer named `Transformer`, as with `scan`, which in training
            recomputes each block in the backward pass (the route `remat="blocks"`). To
            recompute the blocks of any model without saving it, choose the route instead
            (`keras_vit.routes.use_routes(remat="blocks")`). Defaults to False.
        position_embedding: str. How the patches are told where they are (paper appendix
            D.4, Table 8): "learned" (one learned vector per position, `AddPositionEmbs`),
            "learned_2d" (learned row and column embeddings of D/2 each, concatenated:
            `AddPositionEmbs2D`), "sincos_2d" (big_vision's fixed 2-D sine-cosine embedding,
            no weights: `AddSinCosPositionEmbs2D`), "relative" (D.4's relative embeddings:
            nothing is added to the tokens; each block's attention learns an embedding per
            relative offset between two patches, per head, and adds the query's product with
            it to their logit, as Shaw et al., 2018) or "none" (no position information:
            `NoPositionEmbs`). Defaults to "learned".
        scan: bool. The layout 0.4 saved scanning in: the blocks live in one
            `keras_vit.Encoder` layer named `Transformer`, which runs one traced block over
            their stacked weights on JAX (the route `scan="blocks"`: one block to trace and
            compile instead of `num_layers`). The blocks keep their names and weights, so
            loading, saving, conversion and export are unchanged. To scan the blocks of any
            model without saving it, choose the route instead
            (`keras_vit.routes.use_routes(scan="blocks")`). Defaults to False.
        position_resize: "linear" or "bicubic". How the learned position embedding moves to
            another patch grid, when a checkpoint is loaded at another `image_size` and, with
            `dynamic_image_size=True`, in the graph: "linear", the official code's
            (`scipy.ndimage.zoom(order=1)`), or "bicubic", timm's (`resample_abs_pos_embed`,
            torch's antialiased bicubic), which `from_pretrained` sets for timm's checkpoints.
            For `position_embedding="learned"`. Defaults to "linear".
        data_config: None or a data config (a dict with timm's field names, see
            `keras_vit.DataConfig`): the preprocessing the weights expect, kept as
            `model.data_config` at the model's input size. None: the paper's (bilinear
            resize, no crop, `x / 127.5 - 1`). Loading a checkpoint sets its own.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every layer (the head
            computes in float32 under mixed precision). Defaults to the global policy.
        name: str or None. Model name. Defaults to "vit".
        **kwargs: standard `keras.Model` arguments (`trainable`).

    How each piece runs (its execution route) is no argument: see `keras_vit.routes`. The
    attention probabilities are computed only by `model.attention_model()`.

    The model maps images `[B, H, W, 3]` scaled to [-1, 1] (see `keras_vit.preprocess_inputs`)
    to float32 logits `[B, num_classes]` (zero-initialised head, as for fine-tuning), or to the
    representation `[B, D]` if not `include_top`.

    Examples:
    >>> model = ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4,
    ...             mlp_dim=64, num_classes=10)
    >>> model(keras.ops.zeros((1, 32, 32, 3))).shape
    (1, 10)
    """

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        mlp_dim=3072,
        num_classes=1000,
        classifier="token",
        representation_size=None,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        include_top=True,
        gelu_approximate=GELU_APPROXIMATE,
        resnet=None,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        dynamic_image_size=False,
        qkv_bias=True,
        class_token=None,
        fc_norm=False,
        remat=False,
        position_embedding="learned",
        scan=False,
        data_config=None,
        position_resize="linear",
        dtype=None,
        name=None,
        **kwargs,
    ):
        _check_model_kwargs(kwargs)
        args = _checked_arguments(dict(
            image_size=image_size, patch_size=patch_size, hidden_size=hidden_size,
            num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim, num_classes=num_classes,
            classifier=classifier, representation_size=representation_size,
            dropout_rate=dropout_rate, attention_dropout_rate=attention_dropout_rate,
            include_top=include_top, gelu_approximate=gelu_approximate, resnet=resnet,
            layer_norm_epsilon=layer_norm_epsilon, dynamic_image_size=dynamic_image_size,
            qkv_bias=qkv_bias, class_token=class_token, fc_norm=fc_norm, remat=remat,
            position_embedding=position_embedding, scan=scan, position_resize=position_resize))
        policy = checked_policy(dtype)
        parts = _make_layers(args, policy)
        size = (None, None) if args["dynamic_image_size"] else tuple(args["image_size"])
        images = keras.Input((*size, IMAGE_CHANNELS), name="image")
        outputs, _ = _forward(parts, images, args)
        super().__init__(images, outputs, name=name or "vit", **kwargs)
        self._arguments = json.dumps(args)  # a string: Keras does not track it
        self._set_data_config(data_config)
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):  # a quantized model's
            policy = policy.default_policy
        self._base_policy = policy

    # `call` gives the graph's outputs, the blocks run by their route: what Keras would learn
    # by tracing it, the graph states (`framework.symbolic_build`).
    COMPUTES_ITS_GRAPH = True

    def call(self, inputs, training=None, mask=None, **kwargs):
        """The model's graph. Where the `scan` route "blocks" is chosen
        (`keras_vit.routes.use_routes(scan="blocks")`), the same layers with the encoder blocks
        run by `keras_vit.routes.encoder`: scanned over their stacked weights where it can."""
        if routes.route("scan", training) == "none" or mask is not None or kwargs or \
                ENCODER in self._layer_names():
            return super().call(inputs, training=training, mask=mask, **kwargs)
        (images,) = keras.tree.flatten(inputs)  # a dict or list of the one input too
        images = keras.ops.cast(images, self.inputs[0].dtype)  # as the graph's `Input` takes it
        blocks = self._blocks()
        outputs, _ = _forward(self._parts(), images, json.loads(self._arguments),
                              encoder=lambda x: routes.encoder(blocks, x, training))
        return outputs

    def _layer_names(self):
        return [layer.name for layer in self.layers]

    def get_config(self):
        """The constructor's arguments (and the dtype policy: a `DTypePolicyMap` of the
        quantized layers after `model.quantize(...)`, as keras-hub saves one), and the
        `data_config` the model carries: the preprocessing its weights expect, kept in
        `.keras` files."""
        return dict(self.vit_arguments(), trainable=self.trainable,
                    dtype=keras.dtype_policies.serialize(self._saved_policy()),
                    data_config=dict(self.data_config))  # plain lists and floats, as JSON

    @classmethod
    def from_config(cls, config):
        """The model `get_config()` describes, with its `data_config` (a config without the
        field, from keras_vit 0.4 or older, gives the paper's)."""
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    @property
    def data_config(self):
        """The preprocessing the model's weights expect, a `keras_vit.DataConfig` at the
        model's input size: its checkpoint's for a model loaded from one, else the paper's
        (bilinear resize, no crop, [-1, 1]). Every path from pixels reads it (`load_image`,
        `preprocess_inputs`, the data pipelines, `predict`, `evaluate`, training, every
        export). Set it with a data config (a dict with timm's field names, checked) or None
        (the paper's)."""
        return self.__dict__[_DATA_CONFIG_SLOT]

    @data_config.setter
    def data_config(self, value):
        self._set_data_config(value)

    def _set_data_config(self, value):
        size = json.loads(self._arguments)["image_size"]
        config = paper_data_config(size) if value is None else check_data_config(
            dict(value) if isinstance(value, dict) else value,
            f"the data_config of model {self.name!r}").at_size(size)
        object.__setattr__(self, _DATA_CONFIG_SLOT, config)  # not tracked by Keras: a value

    def vit_arguments(self):
        """The `keras_vit.ViT` arguments that rebuild this model (a JSON-serialisable dict):
        its architecture; `scan` and `remat` only where they are True (the layouts 0.4 saved
        these execution choices in, whose weights live in one `Encoder` layer)."""
        arguments = json.loads(self._arguments)
        for name in LAYOUT_ARGUMENTS:
            if not arguments[name]:
                del arguments[name]
        return dict(arguments, name=self.name)

    @property
    def base_policy(self):
        """The dtype policy the layers were made with (before any quantization)."""
        return self._base_policy

    def _saved_policy(self):
        every = [sub for layer in self.layers for sub in (layer, *sublayers(layer))]
        quantized = [layer for layer in every if layer.quantization_mode is not None]
        if not quantized:
            return self._base_policy
        policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=self._base_policy)
        for layer in quantized:
            policy_map[layer.path] = layer.dtype_policy
        return policy_map

    def attention_model(self):
        """A `keras.Model` that shares this model's layers and weights and returns its outputs
        and every block's attention probabilities `[B, heads, N, N]` (before dropout):
        `(outputs, [probs of block 0, ..., block L-1])`."""
        parts = self._parts()
        for block in self._blocks():
            parts[block.name] = _WithAttention(block, name=block.name)
        images = keras.Input(self.inputs[0].shape[1:], name="image")
        outputs, probs = _forward(parts, images, json.loads(self._arguments), attention=True)
        return keras.Model(images, [outputs, probs], name=f"{self.name}_attention")

    def forward_intermediates(self, images, indices=None, norm=False, output_fmt="NHWC",
                              intermediates_only=False, return_prefix_tokens=False,
                              stop_early=False):
        """The outputs of chosen encoder blocks, for dense-prediction heads (ViTDet, DPT,
        UperNet), under timm's name and arguments (`VisionTransformer.forward_intermediates`).

        Args:
            images: a batch `[B, H, W, 3]` preprocessed as the model's `data_config` says (any
                size the model takes: its `image_size`, or multiples of the patch with
                `dynamic_image_size=True`).
            indices: None (every block), an int n (the last n blocks) or a sequence of block
                indices (negative ones count from the end). Defaults to None.
            norm: bool. Pass each block's output through the final LayerNorm
                (`encoder_norm`; a model with `fc_norm=True` has none there, as timm's).
                Defaults to False.
            output_fmt: "NHWC" (spatial maps `[B, H/p, W/p, D]`, Keras' channels-last),
                "NCHW" (timm's default, `[B, D, H/p, W/p]`) or "NLC" (the patch tokens as a
                sequence `[B, N, D]`). The class token is left out of each either way.
                Defaults to "NHWC".
            intermediates_only: bool. Return the list of intermediates only, instead of
                `(final, intermediates)` where `final` is the last block's tokens after the
                final LayerNorm `[B, N(+1), D]`, timm's. Defaults to False.
            return_prefix_tokens: bool. Each intermediate becomes a pair (patch features,
                prefix tokens `[B, P, D]`: the class token, P = 1, or none, P = 0, for a model
                without one). Defaults to False.
            stop_early: bool. Run no block after the last one taken; `final` is then that
                block's tokens after the final LayerNorm, as timm's. Defaults to False.

        Returns:
            `(final, [intermediates])`, or `[intermediates]` with `intermediates_only`, in the
            order of the blocks. The model's dtype policy's compute dtype.

        The function calls `intermediates_model(...)` (made once for each set of arguments):
        use that model to build a head on the features, or to compile it.

        Examples:
        >>> model = ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4,
        ...             mlp_dim=64, num_classes=10)
        >>> maps = model.forward_intermediates(keras.ops.zeros((1, 32, 32, 3)),
        ...                                    intermediates_only=True)
        >>> len(maps), tuple(maps[0].shape)
        (2, (1, 4, 4, 32))
        """
        key = json.dumps(intermediates.options(
            self.vit_arguments()["num_layers"], indices, norm, output_fmt, intermediates_only,
            return_prefix_tokens, stop_early))
        made = self.__dict__.setdefault(_INTERMEDIATES_SLOT, {})
        if key not in made:
            made[key] = self.intermediates_model(**json.loads(key))
        outputs = made[key](images)
        # A functional model returns the one output of a one-element list as it is.
        one = intermediates_only and len(json.loads(key)["indices"]) == 1
        return [outputs] if one else outputs

    def intermediates_model(self, indices=None, norm=False, output_fmt="NHWC",
                            intermediates_only=False, return_prefix_tokens=False,
                            stop_early=False):
        """A `keras.Model` that shares this model's layers and weights and returns what
        `forward_intermediates(images, ...)` returns with the same arguments: a backbone of
        feature maps to build a dense-prediction head on, train with `fit` or export (see
        `keras_vit.export_saved_model(..., features=...)`). A model with `scan=True` or
        `remat=True` runs its blocks one by one in it. As every functional model, one
        output (one index with `intermediates_only`) is returned as it is, not in a list."""
        args = json.loads(self._arguments)
        options = intermediates.options(args["num_layers"], indices, norm, output_fmt,
                                         intermediates_only, return_prefix_tokens, stop_early)
        parts = self._parts()
        for block in self._blocks():
            parts[block.name] = block
        images = keras.Input(self.inputs[0].shape[1:], name="image")
        x, grid = _embed(parts, images, args)
        outputs = intermediates.collect(parts, x, grid, args, options, _base_grid(args))
        return keras.Model(images, outputs, name=f"{self.name}_intermediates")

    def _parts(self):
        """The model's layers by name, without the `Encoder` of a scanned model."""
        return {layer.name: layer for layer in self.layers if layer.name != ENCODER}

    def _blocks(self):
        """The encoder blocks, in order (those of the `Encoder` of a scanned model too)."""
        if ENCODER in self._layer_names():
            return list(self.get_layer(ENCODER).blocks)
        return [self.get_layer(f"encoderblock_{i}")
                for i in range(self.vit_arguments()["num_layers"])]


class _WithAttention(keras.layers.Layer):
    """A block called for its outputs and its attention probabilities (a layer of its own: a
    functional graph takes each layer's outputs in the structure of its first call)."""

    def __init__(self, block, **kwargs):
        super().__init__(dtype=block.dtype_policy, **kwargs)
        self.block = block

    def call(self, inputs, training=None):
        return self.block(inputs, training=training, return_attention_scores=True)

    def compute_output_spec(self, inputs, training=None):
        return self.block.compute_output_spec(inputs, return_attention_scores=True)


# Arguments that are gone, and where their job went.
REMOVED_ARGUMENTS = {
    "kernels": "execution routes are no architecture: choose them with "
               "keras_vit.routes.use_routes(...) or keras_vit.routes.set_routes(...)",
    "backbone": "the hybrid's ResNet is ViT(resnet=...)",
}


def _check_model_kwargs(kwargs):
    """Refuses keyword arguments that neither `ViT` nor `keras.Model` takes."""
    for name in kwargs:
        if name in REMOVED_ARGUMENTS:
            raise TypeError(f"ViT() got an unexpected keyword argument {name!r}: "
                            f"{REMOVED_ARGUMENTS[name]}.")
        if name != "trainable":
            raise TypeError(f"ViT() got an unexpected keyword argument {name!r}. Expected "
                            "keras_vit.ViT's arguments or `trainable`.")
        check_bool("trainable", kwargs[name])


def _checked_arguments(args):
    """`args` with each value checked and normalised (pairs as lists, `class_token` decided),
    or a ValueError naming the first bad one."""
    args["image_size"] = list(to_pair("image_size", args["image_size"]))
    args["patch_size"] = list(to_pair("patch_size", args["patch_size"]))
    for name in ("hidden_size", "num_layers", "num_heads", "mlp_dim"):
        args[name] = check_positive_int(name, args[name])
    args["representation_size"] = check_positive_int(
        "representation_size", args["representation_size"], allow_none=True)
    for name in ("include_top", "dynamic_image_size", "qkv_bias", "fc_norm", "remat", "scan",
                 "gelu_approximate"):
        args[name] = check_bool(name, args[name])
    for name in ("dropout_rate", "attention_dropout_rate"):
        args[name] = check_rate(name, args[name])
    token = args["classifier"] == "token"
    args["class_token"] = check_bool(
        "class_token", token if args["class_token"] is None else args["class_token"])
    args["num_classes"] = (check_positive_int("num_classes", args["num_classes"])
                           if args["include_top"] else args["num_classes"])
    check_choice("classifier", args["classifier"], CLASSIFIERS)
    check_choice("position_embedding", args["position_embedding"], tuple(POSITION_EMBEDDINGS))
    check_choice("position_resize", args["position_resize"], POSITION_RESIZES)
    if args["position_resize"] != "linear" and args["position_embedding"] != "learned":
        raise ValueError(f'position_resize={args["position_resize"]!r} resizes a learned '
                         'position embedding of one vector per patch. Expected '
                         'position_embedding="learned" with it (or position_resize="linear").')
    args["resnet"] = _resnet_arguments(args["resnet"])
    _check_divisible(args)
    check_heads(args["hidden_size"], args["num_heads"])
    _check_memory(args)
    if token and not args["class_token"]:
        raise ValueError('classifier="token" reads the class token, but class_token=False. '
                         'Expected class_token=True (or None), or classifier="gap".')
    if args["fc_norm"] and token:
        raise ValueError('fc_norm=True normalises the average of the patch tokens. Expected '
                         'classifier="gap" with it.')
    return args


def _make_layers(args, policy):
    """The model's layers by name, made with dtype policy `policy` (the head: float32 unless
    `policy` maps it to a quantized one)."""
    head_policy = "float32"
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and "head" in policy:
        head_policy = policy["head"]
    common = dict(dtype=policy)
    patch = tuple(args["patch_size"])
    width, epsilon = args["hidden_size"], args["layer_norm_epsilon"]
    parts = {}
    if args["resnet"] is not None:
        parts["resnet"] = ResNet(name="resnet", **args["resnet"], **common)
    parts["embedding"] = PatchEmbedding(patch, width, flatten=not args["dynamic_image_size"],
                                        name="embedding", **common)
    if args["dynamic_image_size"]:
        parts["patches"] = keras.layers.Reshape((-1, width), name="patches", **common)
    if args["class_token"]:
        parts["cls"] = ClassToken(name="cls", **common)
    grid = _base_grid(args)
    kind = args["position_embedding"]
    if kind == "learned":
        grid_args = dict(grid_size=grid, num_prefix_tokens=int(args["class_token"])) \
            if args["dynamic_image_size"] else {}
        parts["posembed_input"] = AddPositionEmbs(resize=args["position_resize"],
                                                  name="posembed_input", **grid_args, **common)
    else:
        parts["posembed_input"] = POSITION_EMBEDDINGS[kind](
            grid, num_prefix_tokens=int(args["class_token"]), name="posembed_input", **common)
    parts["dropout"] = keras.layers.Dropout(args["dropout_rate"], name="dropout", **common)
    block_args = dict(dropout_rate=args["dropout_rate"],
                      attention_dropout_rate=args["attention_dropout_rate"],
                      gelu_approximate=args["gelu_approximate"], layer_norm_epsilon=epsilon,
                      qkv_bias=args["qkv_bias"], **common)
    if kind == RELATIVE:
        block_args.update(relative_positions=grid[0] * grid[1],
                          num_prefix_tokens=int(args["class_token"]))
    heads, mlp_dim = args["num_heads"], args["mlp_dim"]
    if args["scan"] or args["remat"]:
        parts[ENCODER] = Encoder(args["num_layers"], heads, mlp_dim, scan=args["scan"],
                                 remat=args["remat"], name=ENCODER, **block_args)
    else:
        for i in range(args["num_layers"]):
            parts[f"encoderblock_{i}"] = TransformerBlock(heads, mlp_dim,
                                                          name=f"encoderblock_{i}", **block_args)
    norm = "fc_norm" if args["fc_norm"] else "encoder_norm"
    parts[norm] = keras.layers.LayerNormalization(epsilon=epsilon, name=norm, **common)
    parts["pool"] = TokenPooling(args["classifier"], num_prefix_tokens=int(args["class_token"]),
                                 name="pool", **common)
    if args["representation_size"]:
        parts["pre_logits"] = keras.layers.Dense(
            args["representation_size"], activation="tanh",
            kernel_initializer="lecun_normal",  # Flax `nn.Dense` default.
            name="pre_logits", **common)
    if args["include_top"]:
        # Zero-initialised head, as the paper does for fine-tuning; float32 logits under
        # mixed precision.
        parts["head"] = keras.layers.Dense(args["num_classes"], kernel_initializer="zeros",
                                           bias_initializer="zeros", dtype=head_policy,
                                           name="head")
    return parts


def _forward(parts, images, args, attention=False, encoder=None):
    """Wires the layers `parts` on `images` as equations 1-4: `(outputs, probabilities)`, the
    attention probabilities of every block when `attention` (else an empty list). `encoder`,
    where given, runs the blocks instead (a function of the tokens)."""
    x, _ = _embed(parts, images, args)
    probabilities = []
    if ENCODER in parts and not attention:
        x = parts[ENCODER](x)  # (2), (3) for every block
    elif encoder is not None:
        x = encoder(x)  # (2), (3) for every block
    for i in range(args["num_layers"] if attention or not (ENCODER in parts or encoder) else 0):
        block = parts[f"encoderblock_{i}"]  # (2), (3): x = [B, N(+1), D]
        if attention:
            x, probs = block(x)  # probs = [B, h, N, N]
            probabilities.append(probs)
        else:
            x = block(x)
    if not args["fc_norm"]:
        x = parts["encoder_norm"](x)  # (4) LN(z_L)
    x = parts["pool"](x)  # (4) z_L^0, or the mean of the patch tokens: x = [B, D]
    if args["fc_norm"]:
        x = parts["fc_norm"](x)
    if "pre_logits" in parts:
        x = parts["pre_logits"](x)
    if "head" in parts:
        x = parts["head"](x)  # x = [B, num_classes]
    return x, probabilities


def _embed(parts, images, args):
    """Equation 1 on `images`: `(z_0, grid)`, the tokens `[B, N(+1), D]` and, for a model of
    any input size, the patch grid `[B, gh, gw, D]` they came from (else None)."""
    x = images  # x = [B, H, W, 3]
    if "resnet" in parts:
        x = parts["resnet"](x)  # x = [B, H / stride, W / stride, C]
    grid = None
    if args["dynamic_image_size"]:
        grid = parts["embedding"](x)  # grid = [B, gh, gw, D]
        x = parts["patches"](grid)  # x = [B, N, D]
    else:
        x = parts["embedding"](x)  # (1) x_p E: x = [B, N, D]
    if "cls" in parts:
        x = parts["cls"](x)  # (1) [x_class; x_p E]: x = [B, N + 1, D]
    posembed = parts["posembed_input"]
    x = posembed(x, grid=grid) if grid is not None else posembed(x)  # (1) + E_pos
    return parts["dropout"](x), grid


def _base_grid(args):
    """The patch grid the position embedding is learned for."""
    stride = resnet_stride(args["resnet"]["num_layers"]) if args["resnet"] is not None else 1
    (height, width), (ph, pw) = args["image_size"], args["patch_size"]
    return (height // (ph * stride), width // (pw * stride))


def _check_divisible(args):
    """Refuses an image size that is not a multiple of the patch (times the ResNet's stride)."""
    stride = resnet_stride(args["resnet"]["num_layers"]) if args["resnet"] is not None else 1
    for size, patch, dim in zip(args["image_size"], args["patch_size"], ("height", "width")):
        if size % (patch * stride):
            what = (f"patch_size {patch}" if stride == 1 else
                    f"{patch * stride} (the ResNet's stride {stride} times patch_size {patch})")
            raise ValueError(
                f"image_size {dim} {size} is not divisible by {what}. "
                f"Expected a multiple of {patch * stride} (e.g. "
                f"{size // (patch * stride) * patch * stride or patch * stride}).")


def _check_memory(args):
    """Refuses an architecture whose float32 weights and one image's activations (the tokens
    and an MLP's hidden layer: a lower bound) cannot fit in this machine's memory, before any
    weight is allocated."""
    counted = dict(image_size=args["image_size"], patch_size=args["patch_size"],
                   hidden_size=args["hidden_size"], num_layers=args["num_layers"],
                   mlp_dim=args["mlp_dim"],
                   num_classes=args["num_classes"] if args["include_top"] else None,
                   representation_size=args["representation_size"],
                   class_token=args["class_token"],
                   learned_positions=args["position_embedding"] == "learned",
                   resnet=args["resnet"])
    params = vit_params(**counted)
    tokens = sequence_length(args["image_size"], args["patch_size"], args["class_token"],
                             args["resnet"])
    activations = tokens * (2 * args["hidden_size"] + args["mlp_dim"])  # [N, D] twice, [N, M]
    shown = ", ".join(f"{k}={_pair_text(v)}" for k, v in counted.items()
                      if k in ("image_size", "patch_size", "hidden_size", "num_layers", "mlp_dim"))
    check_fits_in_memory(
        f"ViT({shown})", FLOAT32_BYTES * (params + activations),
        f"for its {params:,} weights and one image's activations (float32)",
        "a smaller image_size, hidden_size, num_layers or mlp_dim")


def _pair_text(value):
    """`16` for a pair of equal sides `[16, 16]`, `(16, 24)` for another, an int as it is."""
    if isinstance(value, list):
        return str(value[0]) if value[0] == value[1] else str(tuple(value))
    return repr(value)


def _resnet_arguments(resnet):
    """The hybrid's `ResNet` arguments (a plain dict, lists for tuples), or None."""
    if resnet is None:
        return None
    if not isinstance(resnet, dict):
        raise ValueError(
            "`resnet` must be None or a dict of keras_vit.ResNet arguments, e.g. "
            f"{{'num_layers': (3, 4, 9)}}. Received: resnet={resnet!r}")
    allowed = ("num_layers", "width_factor", "std_conv_epsilon")
    unknown = sorted(set(resnet) - set(allowed))
    if unknown:
        raise ValueError(f"Unknown `resnet` keys {unknown} in {resnet!r}. Expected some of "
                         f"{allowed}.")
    checked = resnet_args(**resnet)
    return dict(checked, num_layers=list(checked["num_layers"]))
