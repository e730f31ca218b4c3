"""Self-supervised pre-training by masked patch prediction (paper section 4.6, appendix B.1.2).

```python
vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=64, num_layers=2, num_heads=4,
                    mlp_dim=128, include_top=False)
model = keras_vit.pretraining.masked_patch_model(vit)       # shares vit's layers
train = keras_vit.data.from_arrays(images, None, image_size=32, batch_size=16, training=True)
summary = keras_vit.training.fit(model, train, output_dir="runs/mpp", steps=1000,
                                 recipe="pretrain_mpp")      # writes encoder.npz too
# vit now holds the pre-trained encoder; fine-tune it with a new head:
classifier = keras_vit.from_pretrained("runs/mpp/encoder.npz", include_top=True,
                                       num_classes=10)
```

The objective, as in BERT (Devlin et al. 2019) and the paper's appendix B.1.2:

- Each image's patch embeddings (the output of `embedding`, before the class token and the
  position embeddings are added) are corrupted in training: `mask_rate` (50%) of the patch
  positions of every image are selected (exactly `floor(mask_rate * N + 0.5)`, at least one,
  a uniform random choice); of the selected, 80% are replaced by a learned [mask] embedding,
  10% by the embedding of another patch of the same image (a uniformly chosen other
  position, before corruption), and 10% are left as they are. The class token is never
  corrupted; it is not a patch.
- From each patch's output token (after `encoder_norm`; `fc_norm` for the models that have it
  instead), a new Dense layer (`mpp_head`, Flax's default initialisation)
  predicts a target computed from the input images; only the selected positions count in the
  loss (and in `masked_accuracy`). The targets (`patch_targets`), for images in [-1, 1]
  mapped back to [0, 1]:
  - "mean_color" (the paper's choice): the patch's mean colour with each of R, G, B
    quantised to 3 bits (`min(floor(8 v), 7)`), one of 512 classes `64 r + 8 g + b`;
    softmax cross-entropy.
  - "downsized_color" (appendix B.1.2, option 2): the patch downsized to 4x4 by averaging
    4x4 equal sub-patches (row-major), each sub-patch's mean colour as above: 16
    predictions of 512 classes; cross-entropy averaged over the 16. The patch's pixel size
    must be divisible by 4.
  - "pixels" (option 3): L2 regression of the patch's pixels as the model sees them (in
    [-1, 1]), `[ph * pw * 3]` values in row-major, channel-last order; the loss is their mean
    squared error.
  A hybrid's patches are the image regions its feature-map cells cover (`patch_size` times
  the ResNet's stride).

Outside training (`model.evaluate`, `model.predict`) nothing is corrupted and every patch
counts. The labels of the input pipeline are never used: any `keras_vit.data` pipeline
works, `from_arrays(images, None, ...)` for unlabelled images.

The model reuses the ViT's layer objects (the same weights): after pre-training, `vit`
itself holds the pre-trained encoder. The pre-training head and the [mask] embedding are
dropped for fine-tuning, as in the paper: `encoder_params()` (and the `encoder.npz` that
`keras_vit.training.fit` writes for this model) holds the ViT's weights without `head` and
`pre_logits`, in the official layout, and `encoder_config` the `keras_vit.ViT` arguments of
that encoder (`include_top=False`).
"""

import keras
from keras import ops

from keras_vit import routes
from keras_vit.encoder import Encoder
from keras_vit.model_parts import vit_config
from keras_vit.model import RoutedSteps, ViT
from keras_vit.model_parts import encoder_blocks, encoder_layer
from keras_vit.preprocessing import IMAGE_CHANNELS, normalization, scale_pixels
from keras_vit.checks import (
    check_choice,
    check_int,
    check_number,
    to_pair,
)
from keras_vit.weights import model_params
from keras_vit.weights.loading import PRETRAINING_LAYERS

_register = keras.saving.register_keras_serializable(package="keras_vit")

OBJECTIVES = ("mean_color", "downsized_color", "pixels")
# Appendix B.1.2: corrupt 50% of the patch embeddings; of those 80% [mask], 10% a random other
# patch embedding, 10% kept (BERT's split; BERT corrupts 15%).
MASK_RATE = 0.5
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1
# 3-bit colour: 8 levels per channel, 512 colours.
COLOR_LEVELS = 8
NUM_COLORS = COLOR_LEVELS ** 3
# Option 2 of appendix B.1.2: a 4x4 downsized patch, 16 predictions of 512 colours.
DOWNSIZED_GRID = 4
# The [mask] embedding's initialisation: BERT's normal(0.02), as the position embeddings.
MASK_EMBEDDING_STDDEV = 0.02
# The layers a keras_vit.ViT encoder may lack: `resnet` (hybrids only), `cls` (no class token),
# `posembed_input`. The others: `embedding`, `dropout`, `encoderblock_{i}`, `encoder_norm`.
_OPTIONAL = ("resnet", "cls", "posembed_input")


def color_classes(colors):
    """The 3-bit colour class of RGB values in [-1, 1]: `64 r + 8 g + b`, each channel's value
    `v` mapped to [0, 1] and quantised to `min(floor(8 v), 7)`.

    Args:
        colors: float tensor `[..., 3]` in [-1, 1].

    Returns:
        int32 tensor `[...]` in [0, 512).
    """
    unit = (ops.cast(colors, "float32") + 1.0) / 2.0  # [..., 3] in [0, 1]
    levels = ops.cast(ops.clip(ops.floor(unit * COLOR_LEVELS), 0, COLOR_LEVELS - 1), "int32")
    return (levels[..., 0] * COLOR_LEVELS + levels[..., 1]) * COLOR_LEVELS + levels[..., 2]


def patch_targets(images, patch_size, objective="mean_color"):
    """The prediction targets of every patch (see the module docstring), patches in row-major
    order as `PatchEmbedding` flattens them.

    Args:
        images: float tensor `[B, H, W, 3]` in [-1, 1]; H and W multiples of the patch size.
        patch_size: int or (height, width). The patch in pixels.
        objective: "mean_color", "downsized_color" or "pixels". Defaults to "mean_color".

    Returns:
        "mean_color": int32 `[B, N]`; "downsized_color": int32 `[B, N, 16]`; "pixels":
        float32 `[B, N, ph * pw * 3]`.
    """
    ph, pw = to_pair("patch_size", patch_size)
    check_choice("objective", objective, OBJECTIVES)
    images = ops.cast(images, "float32")
    height, width, channels = ops.shape(images)[1], ops.shape(images)[2], IMAGE_CHANNELS
    rows, cols = height // ph, width // pw
    x = ops.reshape(images, (-1, rows, ph, cols, pw, channels))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))  # x = [B, rows, cols, ph, pw, 3]
    x = ops.reshape(x, (-1, rows * cols, ph, pw, channels))  # x = [B, N, ph, pw, 3]
    if objective == "pixels":
        return ops.reshape(x, (-1, rows * cols, ph * pw * channels))  # [B, N, ph * pw * 3]
    if objective == "mean_color":
        return color_classes(ops.mean(x, axis=(2, 3)))  # [B, N]
    grid = DOWNSIZED_GRID
    x = ops.reshape(x, (-1, rows * cols, grid, ph // grid, grid, pw // grid, channels))
    x = ops.mean(x, axis=(3, 5))  # x = [B, N, 4, 4, 3]: the downsized patch
    return color_classes(ops.reshape(x, (-1, rows * cols, grid * grid, channels)))  # [B, N, 16]


@_register
class PatchCorruption(keras.layers.Layer):
    """BERT-style corruption of patch embeddings, in training only (see the module docstring).

    Args:
        mask_rate: float in (0, 1). Fraction of the patch positions selected per image.
            Defaults to 0.5.
        mask_fraction: float. Fraction of the selected replaced by the [mask] embedding.
            Defaults to 0.8.
        random_fraction: float. Fraction of the selected replaced by another patch of the same
            image; the rest are kept. Defaults to 0.1.
        seed: int or None. Seed of the layer's `keras.random.SeedGenerator`. Defaults to None.
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: patch embeddings `[B, N, D]`. Output: `(embeddings [B, N, D], selected [B, N])`,
    `selected` float32, 1.0 at the selected positions (all ones outside training, where
    nothing is corrupted). Weight: `mask_embedding` `[D]`.
    """

    CONFIG_ARGS = ("mask_rate", "mask_fraction", "random_fraction", "seed")

    def __init__(self, mask_rate=MASK_RATE, mask_fraction=MASK_FRACTION,
                 random_fraction=RANDOM_FRACTION, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.mask_rate = check_number("mask_rate", mask_rate, 0.0, 1.0, low_inclusive=False)
        self.mask_fraction = check_number("mask_fraction", mask_fraction, 0.0, 1.0,
                                          high_inclusive=True)
        self.random_fraction = check_number("random_fraction", random_fraction, 0.0, 1.0,
                                            high_inclusive=True)
        if self.mask_fraction + self.random_fraction > 1.0:
            raise ValueError(
                f"mask_fraction {mask_fraction} + random_fraction {random_fraction} exceed 1. "
                "Expected fractions of the selected patches that sum to at most 1 (the rest "
                "are kept).")
        self.seed = check_int("seed", seed, allow_none=True)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        self.mask_embedding = self.add_weight(
            shape=(input_shape[-1],), name="mask_embedding",
            initializer=keras.initializers.RandomNormal(stddev=MASK_EMBEDDING_STDDEV))

    def call(self, patches, training=None):
        # patches = [B, N, D]
        batch, num = ops.shape(patches)[0], ops.shape(patches)[1]
        if not training:
            return patches, ops.ones((batch, num), "float32")
        draws = [keras.random.uniform((batch, num), seed=self.seed_generator) for _ in range(3)]
        order, action, other = draws  # each [B, N], uniform in [0, 1)
        num_float = ops.cast(num, "float32")
        count = ops.maximum(ops.floor(self.mask_rate * num_float + 0.5), 1.0)
        rank = ops.argsort(ops.argsort(order, axis=-1), axis=-1)  # a random permutation
        selected = ops.cast(rank, "float32") < count  # [B, N]: exactly `count` per image
        masked = ops.logical_and(selected, action < self.mask_fraction)
        randomised = ops.logical_and(
            ops.logical_and(selected, action >= self.mask_fraction),
            action < self.mask_fraction + self.random_fraction)
        # Another position of the same image: i + 1 + uniform{0 .. N - 2}, modulo N.
        offset = 1 + ops.minimum(ops.cast(ops.floor(other * (num_float - 1.0)), "int32"),
                                 num - 2)
        source = ops.mod(ops.arange(num, dtype="int32")[None, :] + offset, num)  # [B, N]
        others = ops.take_along_axis(patches, source[..., None], axis=1)  # [B, N, D]
        mask = ops.cast(self.mask_embedding, patches.dtype)[None, None, :]  # [1, 1, D]
        x = ops.where(randomised[..., None], others, patches)
        x = ops.where(masked[..., None], mask, x)  # x = [B, N, D]
        return x, ops.cast(selected, "float32")

    def compute_output_shape(self, input_shape):
        return input_shape, tuple(input_shape[:2])

    def get_config(self):
        return dict(super().get_config(), **{name: getattr(self, name)
                                             for name in self.CONFIG_ARGS})


def _layer(vit, name):
    names = {layer.name for layer in vit.layers}
    return vit.get_layer(name) if name in names else None


@_register
class MaskedPatchModel(RoutedSteps, keras.Model):
    """A ViT's encoder with masked patch prediction on top: build it with `masked_patch_model`.

    Calling it on images `[B, H, W, 3]` preprocessed as its `data_config` says (the ViT's;
    the paper's [-1, 1] by default) returns a dict: `predictions` (float32 logits
    `[B, N, 512]`, `[B, N, 16, 512]`, or pixels `[B, N, ph * pw * 3]`), `targets`
    (`patch_targets` of the same pixels in [-1, 1]) and `weights` (`[B, N]`, 1.0 where the
    loss counts).
    `compute_loss` is the objective (the pipeline's labels are not used), `masked_accuracy`
    the accuracy of the colour classes at the selected positions.

    Args:
        vit: a model built by `keras_vit.ViT` (any variant: plain or hybrid, class token or
            "gap"), or a dict of `keras_vit.ViT` arguments to build one. Its layers are
            reused, not copied.
        objective: "mean_color", "downsized_color" or "pixels". Defaults to "mean_color".
        mask_rate, mask_fraction, random_fraction, seed: as for `PatchCorruption`.
        name: str or None. Defaults to "<vit name>_mpp".
    """

    # `keras_vit.training` compiles no loss or metric for it and does not need labels.
    self_supervised = True

    def __init__(self, vit, objective="mean_color", mask_rate=MASK_RATE,
                 mask_fraction=MASK_FRACTION, random_fraction=RANDOM_FRACTION, seed=None,
                 name=None, **kwargs):
        if isinstance(vit, dict):
            vit = ViT(**vit)
        if not isinstance(vit, keras.Model):
            raise ValueError("`vit` must be a keras_vit.ViT model or a dict of its arguments. "
                             f"Received: vit={vit!r:.100}")
        config = vit_config(vit)  # raises for a model keras_vit.ViT did not build
        # The ViT's dtype policy (so that Keras adds loss scaling under mixed float16), but
        # the images are not cast: the targets come from the exact pixels, and each layer
        # casts its own inputs.
        super().__init__(name=name or f"{vit.name}_mpp",
                         dtype=vit.get_layer("embedding").dtype_policy, autocast=False,
                         **kwargs)
        self.objective = check_choice("objective", objective, OBJECTIVES)
        self.encoder_config = dict(config, include_top=False, num_classes=None,
                                   representation_size=None)
        # The ViT's preprocessing, which its inputs have (a value, not tracked by Keras).
        object.__setattr__(self, "_data_config", vit.data_config)
        self.stem, self.cls, self.posembed = (_layer(vit, name) for name in _OPTIONAL)
        self.embedding = vit.get_layer("embedding")
        self.dropout = vit.get_layer("dropout")
        # The encoder blocks, or the one layer that holds them all (`scan=True`, `remat=True`).
        encoder = encoder_layer(vit)
        self.blocks = [encoder] if encoder is not None else encoder_blocks(vit)
        # The final norm of the token sequence; `fc_norm` models normalise each token with it.
        self.norm = _layer(vit, "encoder_norm") or vit.get_layer("fc_norm")
        self.num_prefix = int(self.cls is not None)
        stride = self.stem.stride if self.stem is not None else 1
        self.pixel_patch = tuple(p * stride for p in self.embedding.patch_size)
        if objective == "downsized_color" and any(p % DOWNSIZED_GRID for p in self.pixel_patch):
            raise ValueError(
                f"objective 'downsized_color' averages {DOWNSIZED_GRID}x{DOWNSIZED_GRID} "
                f"sub-patches, but the patches are {self.pixel_patch[0]}x{self.pixel_patch[1]} "
                f"pixels. Expected a patch size divisible by {DOWNSIZED_GRID}, or another "
                "objective.")
        grid = _vit_grid(vit)
        if grid is not None and grid[0] * grid[1] < 2:
            raise ValueError(f"Masked patch prediction needs at least 2 patches; the model has "
                             f"a {grid[0]}x{grid[1]} grid.")
        width = self.embedding.hidden_size
        policy = self.embedding.dtype_policy
        self.corruption = PatchCorruption(mask_rate, mask_fraction, random_fraction, seed,
                                          dtype=policy, name="masked_patches")
        self.head = keras.layers.Dense(
            self._head_units(), kernel_initializer="lecun_normal",  # Flax `nn.Dense` default
            dtype="float32", name="mpp_head")  # float32 outputs under mixed precision
        self.corruption.build((None, None, width))
        self.head.build((None, None, width))
        if objective == "pixels":
            self.loss_fn = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
            self.accuracy = None
        else:
            self.loss_fn = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight")
            self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="masked_accuracy")
        self.built = True

    @property
    def data_config(self):
        """The preprocessing of the images it takes: the ViT's (`keras_vit.ViT.data_config`),
        which `keras_vit.training.fit` holds its pipelines to and records with the run."""
        return self._data_config

    def _paper_scaled(self, images):
        """`images`, normalised with the data config's mean and std, as the paper's [-1, 1]
        scaling of the same pixels: the objectives' colour bins and regression targets are
        defined there."""
        if self._data_config.is_paper:
            return images
        scale, offset = normalization(self._data_config)
        images = ops.cast(images, "float32")
        pixels = (images - ops.convert_to_tensor(offset, "float32")) * ops.convert_to_tensor(
            scale, "float32")  # [0, 255]
        return scale_pixels(pixels)

    def _head_units(self):
        if self.objective == "mean_color":
            return NUM_COLORS
        if self.objective == "downsized_color":
            return DOWNSIZED_GRID * DOWNSIZED_GRID * NUM_COLORS
        return self.pixel_patch[0] * self.pixel_patch[1] * IMAGE_CHANNELS

    def embed(self, images, training=None):
        """The encoder's input sequence `[B, prefix + N, D]` (before `dropout`), its patch
        embeddings corrupted in training, and `selected` `[B, N]` (see `PatchCorruption`)."""
        x = images if self.stem is None else self.stem(images, training=training)
        grid = self.embedding(x)  # [B, N, D], or [B, gh, gw, D] for dynamic_image_size
        patches = grid if len(grid.shape) == 3 else ops.reshape(
            grid, (ops.shape(grid)[0], -1, grid.shape[-1]))  # patches = [B, N, D]
        x, selected = self.corruption(patches, training=training)  # x = [B, N, D]
        if self.cls is not None:
            x = self.cls(x)  # x = [B, N + 1, D]
        if self.posembed is not None:
            x = self.posembed(x) if len(grid.shape) == 3 else self.posembed(x, grid=grid)
        return x, selected

    def call(self, images, training=None):
        # images = [B, H, W, 3], preprocessed as `data_config` says ([-1, 1]: the paper's)
        x, selected = self.embed(images, training)
        x = self.dropout(x, training=training)
        if isinstance(self.blocks[0], Encoder):  # the 0.4 layouts' one layer
            x = self.blocks[0](x, training=training)  # x = [B, prefix + N, D]
        else:  # in turn, or scanned where that route is chosen
            x = routes.encoder(self.blocks, x, training)  # x = [B, prefix + N, D]
        x = self.norm(x)[:, self.num_prefix:]  # x = [B, N, D], the patch tokens
        predictions = self.head(x)  # [B, N, units], float32
        if self.objective == "downsized_color":
            predictions = ops.reshape(predictions, (ops.shape(predictions)[0], -1,
                                                    DOWNSIZED_GRID * DOWNSIZED_GRID,
                                                    NUM_COLORS))  # [B, N, 16, 512]
        targets = patch_targets(self._paper_scaled(images), self.pixel_patch, self.objective)
        return {"predictions": predictions, "targets": targets, "weights": selected}

    def _position_weights(self, outputs):
        weights = outputs["weights"]  # [B, N]
        if self.objective == "downsized_color":  # each of the 16 sub-patches counts
            weights = ops.repeat(weights[..., None], DOWNSIZED_GRID * DOWNSIZED_GRID, axis=-1)
        return weights

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The objective's loss at the selected positions; the labels `y` are not used."""
        return self.loss_fn(y_pred["targets"], y_pred["predictions"],
                            sample_weight=self._position_weights(y_pred))

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if self.accuracy is not None:
            self.accuracy.update_state(y_pred["targets"], y_pred["predictions"],
                                       sample_weight=self._position_weights(y_pred))
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def encoder_params(self):
        """The ViT encoder's weights as a dict of NumPy arrays in the official layout (no
        `head`, `pre_logits`, [mask] embedding or pre-training head): a checkpoint for
        `keras_vit.load_pretrained` / `from_pretrained` with `encoder_config`."""
        return {key: value for key, value in model_params(self).items()
                if key.split("/")[0] not in PRETRAINING_LAYERS}

    def get_config(self):
        vit = self.encoder_config  # with its weights' preprocessing where not the paper's
        if not self._data_config.is_paper:
            vit = dict(vit, data_config=dict(self._data_config))
        return dict(vit=vit, objective=self.objective,
                    mask_rate=self.corruption.mask_rate,
                    mask_fraction=self.corruption.mask_fraction,
                    random_fraction=self.corruption.random_fraction,
                    seed=self.corruption.seed, name=self.name)


def _vit_grid(vit):
    """The patch grid `(rows, cols)` of a fixed-size ViT, None for `dynamic_image_size`."""
    embedding = vit.get_layer("embedding")
    size = vit.inputs[0].shape[1:3]
    if None in size:
        return None
    stride = vit.get_layer("resnet").stride if _layer(vit, "resnet") is not None else 1
    return tuple(s // (p * stride) for s, p in zip(size, embedding.patch_size))


def masked_patch_model(vit, objective="mean_color", mask_rate=MASK_RATE,
                       mask_fraction=MASK_FRACTION, random_fraction=RANDOM_FRACTION, seed=None,
                       name=None):
    """The masked-patch-prediction model of `vit` (paper appendix B.1.2), for `model.fit` or
    `keras_vit.training.fit(..., recipe="pretrain_mpp")` on unlabelled images.

    Build it in the strategy scope (or `keras.distribution`) the ViT was built in: it adds
    the [mask] embedding and the prediction head.

    Args:
        vit: `keras_vit.ViT` or dict. A `keras_vit.ViT` model (plain or hybrid, "token" or
            "gap", any head: it is not used), or a dict of `keras_vit.ViT` arguments.
        objective: str. "mean_color" (the paper's: the 3-bit mean colour, 512 classes),
            "downsized_color" (a 4x4 downsized patch: 16 x 512 classes) or "pixels" (L2
            regression of the patch's pixels in [-1, 1]). Defaults to "mean_color".
        mask_rate: float in (0, 1). Fraction of each image's patches corrupted and predicted.
            Defaults to 0.5.
        mask_fraction: float. Of those, the fraction replaced by the [mask] embedding.
            Defaults to 0.8.
        random_fraction: float. Of those, the fraction replaced by another patch of the same
            image (the rest are kept). Defaults to 0.1.
        seed: int or None. Seed of the corruption's random draws. Defaults to None.
        name: str or None. Defaults to "<vit name>_mpp".

    Returns:
        A `MaskedPatchModel` sharing `vit`'s layers and weights.

    Examples:
    >>> vit = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
    ...                     num_heads=2, mlp_dim=64, include_top=False)
    >>> model = masked_patch_model(vit, seed=0)
    >>> model(keras.ops.zeros((2, 16, 16, 3)))["predictions"].shape
    (2, 16, 512)
    """
    return MaskedPatchModel(vit, objective, mask_rate, mask_fraction, random_fraction, seed,
                            name)
