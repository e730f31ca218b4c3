"""The ResNet of the paper's hybrids (section 3.1): a BiT-style ResNetV2 feeding the ViT.

As in the official `vit_jax/models_resnet.py` and the root block in `models_vit.py`:
7x7/2 weight-standardised conv (no bias) -> GroupNorm -> ReLU -> 3x3/2 max-pool (SAME), then
stages of bottleneck units (stride on the 3x3 conv, projection on a stage's first unit,
GroupNorm after every conv, ReLU after the residual sum). The ViT then embeds patches of the
feature map. Weight names follow the checkpoint (`conv_root`, `gn_root`,
`block{s}/unit{u}/conv{1,2,3}`, `gn{1,2,3}`, `conv_proj`, `gn_proj`).
"""

import keras
from keras import ops

from keras_vit.layer_config import ConfigArgs
from keras_vit.checks import check_image_sides, check_positive_int, check_positive_number

# The official StdConv adds this to the kernel's standard deviation (`weight_standardize`).
STD_CONV_EPSILON = 1e-5
# Flax `nn.GroupNorm` defaults: 32 groups, epsilon 1e-6 (Keras' default epsilon is 1e-3).
GROUP_NORM_GROUPS = 32
GROUP_NORM_EPSILON = 1e-6

_register = keras.saving.register_keras_serializable(package="keras_vit")


def _group_norm(name, dtype, zero_scale=False):
    return keras.layers.GroupNormalization(
        groups=GROUP_NORM_GROUPS,
        epsilon=GROUP_NORM_EPSILON,
        gamma_initializer="zeros" if zero_scale else "ones",
        name=name,
        dtype=dtype,
    )


@_register
class StdConv2D(ConfigArgs, keras.layers.Layer):
    """A bias-free convolution with weight standardisation, SAME padding.

    The kernel is standardised over (height, width, input channels) before every use:
    `(w - mean) / (std + epsilon)`, as the official `StdConv`.

    Args:
        filters: int. Output channels.
        kernel_size: int. Square kernel size.
        strides: int. Defaults to 1.
        epsilon: float. Added to the kernel's standard deviation. Defaults to 1e-5 (official).
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, H, W, C]`. Output: `[B, ceil(H / strides), ceil(W / strides), filters]`.
    """

    CONFIG_ARGS = ("filters", "kernel_size", "strides", "epsilon")

    def __init__(self, filters, kernel_size, strides=1, epsilon=STD_CONV_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.filters = check_positive_int("filters", filters)
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        self.strides = check_positive_int("strides", strides)
        self.epsilon = check_positive_number("epsilon", epsilon)

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(self.kernel_size, self.kernel_size, input_shape[-1], self.filters),
            initializer="lecun_normal",  # Flax `nn.Conv` default.
            name="kernel",
        )

    def standardized_kernel(self):
        """The kernel as the convolution uses it, in float32."""
        w = ops.cast(self.kernel, "float32")  # w = [kh, kw, C, F]
        mean = ops.mean(w, axis=(0, 1, 2), keepdims=True)
        std = ops.std(w, axis=(0, 1, 2), keepdims=True)
        return (w - mean) / (std + self.epsilon)

    def call(self, inputs):
        kernel = ops.cast(self.standardized_kernel(), inputs.dtype)
        return ops.conv(inputs, kernel, strides=self.strides, padding="same")

    def compute_output_shape(self, input_shape):
        def out(size):
            return None if size is None else -(-size // self.strides)

        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), self.filters)



@_register
class BottleneckUnit(ConfigArgs, keras.layers.Layer):
    """A pre-activation-free ResNetV2 bottleneck unit (`ResidualUnit` in the official code).

        y = relu(gn1(conv1 1x1)) -> relu(gn2(conv2 3x3/stride)) -> gn3(conv3 1x1, 4x features)
        out = relu(residual + y), residual = gn_proj(conv_proj 1x1/stride) when the shape changes

    Args:
        features: int. Bottleneck width; the unit outputs `4 * features` channels.
        strides: int. Stride of the 3x3 conv (and of the projection). Defaults to 1.
        std_conv_epsilon: float. Weight-standardisation epsilon. Defaults to 1e-5.
        **kwargs: standard `keras.layers.Layer` arguments.
    """

    CONFIG_ARGS = ("features", "strides", "std_conv_epsilon")

    def __init__(self, features, strides=1, std_conv_epsilon=STD_CONV_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.features = check_positive_int("features", features)
        self.strides = check_positive_int("strides", strides)
        self.std_conv_epsilon = check_positive_number("std_conv_epsilon", std_conv_epsilon)

    def build(self, input_shape):
        f, eps, dtype = self.features, self.std_conv_epsilon, self.dtype_policy
        self.needs_projection = input_shape[-1] != 4 * f or self.strides != 1
        self.conv1 = StdConv2D(f, 1, epsilon=eps, name="conv1", dtype=dtype)
        self.gn1 = _group_norm("gn1", dtype)
        self.conv2 = StdConv2D(f, 3, self.strides, epsilon=eps, name="conv2", dtype=dtype)
        self.gn2 = _group_norm("gn2", dtype)
        self.conv3 = StdConv2D(4 * f, 1, epsilon=eps, name="conv3", dtype=dtype)
        self.gn3 = _group_norm("gn3", dtype, zero_scale=True)  # official: scale_init zeros
        shape = input_shape
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)
        if self.needs_projection:
            self.conv_proj = StdConv2D(
                4 * f, 1, self.strides, epsilon=eps, name="conv_proj", dtype=dtype
            )
            self.gn_proj = _group_norm("gn_proj", dtype)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(shape)

    def call(self, inputs):
        # inputs = [B, H, W, C]
        residual = inputs
        if self.needs_projection:
            residual = self.gn_proj(self.conv_proj(inputs))  # [B, H/s, W/s, 4f]
        y = ops.relu(self.gn1(self.conv1(inputs)))  # y = [B, H, W, f]
        y = ops.relu(self.gn2(self.conv2(y)))  # y = [B, H/s, W/s, f]
        y = self.gn3(self.conv3(y))  # y = [B, H/s, W/s, 4f]
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        def out(size):
            return None if size is None else -(-size // self.strides)

        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), 4 * self.features)



def resnet_args(num_layers=(3, 4, 9), width_factor=1, std_conv_epsilon=STD_CONV_EPSILON):
    """`ResNet`'s arguments, checked and normalised (`num_layers` a tuple), by arithmetic: no
    layer is built."""
    if isinstance(num_layers, (str, bytes)) or not hasattr(num_layers, "__iter__"):
        raise ValueError("`num_layers` must be a sequence of positive integers (units per "
                         f"stage), e.g. (3, 4, 9). Received: num_layers={num_layers!r:.60}")
    return dict(num_layers=tuple(check_positive_int("num_layers", n) for n in num_layers),
                width_factor=check_positive_int("width_factor", width_factor),
                std_conv_epsilon=check_positive_number("std_conv_epsilon", std_conv_epsilon))


@_register
class ResNet(ConfigArgs, keras.layers.Layer):
    """The hybrids' ResNet: root block, then stages of bottleneck units.

    Args:
        num_layers: tuple of ints. Units per stage, e.g. (3, 4, 9) for R50+ViT-B/16; empty for
            the root block alone (R+ViT-Ti/16). Stage s has width `64 * width_factor * 2**s`
            and its first unit strides 2 (stage 1: 1).
        width_factor: int. Multiplies the widths. Defaults to 1.
        std_conv_epsilon: float. Weight-standardisation epsilon. Defaults to 1e-5 (official).
        **kwargs: standard `keras.layers.Layer` arguments.

    Input: `[B, H, W, 3]`. Output: `[B, H / stride, W / stride, C]` with `stride` =
    4 * 2**(len(num_layers) - 1) (4 for the root alone) and C = 4 * width of the last stage
    (the root's width without stages).
    """

    CONFIG_ARGS = ("num_layers", "width_factor", "std_conv_epsilon")

    def __init__(
        self, num_layers=(3, 4, 9), width_factor=1, std_conv_epsilon=STD_CONV_EPSILON, **kwargs
    ):
        super().__init__(**kwargs)
        for name, value in resnet_args(num_layers, width_factor, std_conv_epsilon).items():
            setattr(self, name, value)

    @property
    def stride(self):
        """Total downscaling of the ResNet (root: 4; each stage after the first: 2)."""
        return resnet_stride(self.num_layers)

    def build(self, input_shape):
        width, dtype = 64 * self.width_factor, self.dtype_policy
        self.conv_root = StdConv2D(
            width, 7, 2, epsilon=self.std_conv_epsilon, name="conv_root", dtype=dtype
        )
        self.gn_root = _group_norm("gn_root", dtype)
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="same", dtype=dtype)
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = self.pool.compute_output_shape(shape)
        # Bottleneck units in order, named block{stage}_unit{unit} (from 1, as the checkpoint).
        # A plain list of layers: Keras tracks (and saves) layers in lists on every release.
        self.units = []
        for s, count in enumerate(self.num_layers, 1):
            for u in range(1, count + 1):
                unit = BottleneckUnit(
                    width * 2 ** (s - 1),
                    strides=2 if s > 1 and u == 1 else 1,
                    std_conv_epsilon=self.std_conv_epsilon,
                    name=f"block{s}_unit{u}",
                    dtype=dtype,
                )
                unit.build(shape)
                shape = unit.compute_output_shape(shape)
                self.units.append(unit)

    def call(self, images):
        # images = [B, H, W, 3]
        check_image_sides(images.shape, (1, 1), "an empty image")
        x = ops.relu(self.gn_root(self.conv_root(images)))  # x = [B, H/2, W/2, width]
        x = self.pool(x)  # x = [B, H/4, W/4, width]
        for unit in self.units:
            x = unit(x)  # stage s: [B, H/(4*2^(s-1)), W/(4*2^(s-1)), 4*width*2^(s-1)]
        return x

    def compute_output_shape(self, input_shape):
        def out(size):
            return None if size is None else -(-size // self.stride)

        width = 64 * self.width_factor
        channels = 4 * width * 2 ** (len(self.num_layers) - 1) if self.num_layers else width
        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), channels)


def resnet_stride(num_layers):
    """The total downscaling of a `ResNet` with `num_layers` units per stage (root: 4; each
    stage after the first: 2)."""
    return 4 * 2 ** max(len(num_layers) - 1, 0)
