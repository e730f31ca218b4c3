"""Every paper variant as data: one table, one generic builder (`keras_vit.model.ViT`).

Sizes follow the official `vit_jax/configs/models.py`; parameter counts are at 224 px with a
1000-class head and no representation layer: those of the official `models_test.py`, except
S/32, B/8, R26+B/32, R26+S/32 and R+Ti/16, derived from the same formula (they agree with timm).
"""

import dataclasses
import re

# The arguments of `keras_vit.ViT`, in its order: the keys a configuration document's `model`
# may hold (`weights.config_json`). tests/test_model.py checks them against the signature.
VIT_ARGUMENTS = ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
                 "num_classes", "classifier", "representation_size", "dropout_rate",
                 "attention_dropout_rate", "include_top", "gelu_approximate", "resnet",
                 "layer_norm_epsilon", "dynamic_image_size", "qkv_bias", "class_token", "fc_norm",
                 "remat", "position_embedding", "scan", "data_config", "position_resize",
                 "dtype", "name")

# Transformer sizes keyed by the paper's names (as in big_vision's table).
MODEL_SIZES = {
    "Ti": dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    "S": dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    "B": dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    "L": dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    "H": dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One paper variant.

    Attributes:
        name: str. Paper name, e.g. "B/16".
        size: str. Key into `MODEL_SIZES`.
        patch_size: int. Patch size in pixels.
        dropout_rate: float. Dropout of the official config.
        params: int. Parameter count at 224 px with 1000 classes.
        resnet: tuple or None. For hybrids, the ResNet's units per stage (`keras_vit.ResNet`);
            `patch_size` then counts feature-map cells.
    """

    name: str
    size: str
    patch_size: int
    dropout_rate: float
    params: int
    resnet: tuple = None

    @property
    def builder_name(self):
        """The public builder's name, e.g. "ViT_B16", "ViT_R50_B16"."""
        return "ViT_" + self.name.replace("/", "").replace("+", "_")

    def config(self):
        """The keyword arguments of `keras_vit.ViT` for this variant."""
        config = dict(
            patch_size=self.patch_size, dropout_rate=self.dropout_rate, **MODEL_SIZES[self.size]
        )
        if self.resnet is not None:
            config["resnet"] = {"num_layers": self.resnet}
        return config


VARIANTS = {
    v.name: v
    for v in (
        Variant("Ti/16", "Ti", 16, 0.0, 5_717_416),
        Variant("S/16", "S", 16, 0.0, 22_050_664),
        Variant("S/32", "S", 32, 0.0, 22_878_952),
        Variant("B/8", "B", 8, 0.0, 86_576_872),
        Variant("B/16", "B", 16, 0.0, 86_567_656),
        Variant("B/32", "B", 32, 0.0, 88_224_232),
        Variant("L/16", "L", 16, 0.1, 304_326_632),
        Variant("L/32", "L", 32, 0.0, 306_535_400),
        Variant("H/14", "H", 14, 0.1, 632_045_800),
        # Hybrids (official configs/models.py): ResNet stages, then 1x1 patches of the
        # feature map (8x8 on the root block alone for R+Ti/16: stride 4 * 8 = 32 in all;
        # the official comment's "/16" does not match its code).
        Variant("R50+B/16", "B", 1, 0.1, 98_659_112, resnet=(3, 4, 9)),
        Variant("R50+L/32", "L", 1, 0.1, 328_994_856, resnet=(3, 4, 6, 3)),
        Variant("R26+B/32", "B", 1, 0.0, 101_383_976, resnet=(2, 2, 2, 2)),
        Variant("R26+S/32", "S", 1, 0.0, 36_431_912, resnet=(2, 2, 2, 2)),
        Variant("R+Ti/16", "Ti", 8, 0.0, 6_337_704, resnet=()),
    )
}


def get_variant(name):
    """Looks up a variant by any common spelling: "B/16", "ViT-B/16", "ViT_B16", "vit_b16".

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(name, Variant):
        return name
    key = None
    if isinstance(name, str):
        match = re.fullmatch(
            r"(?:vit[-_]?)?(?:(r\d*)[-_+](?:vit[-_]?)?)?(ti|s|b|l|h)[-_/]?(\d+)",
            name.strip(),
            re.IGNORECASE,
        )
        if match:
            size = {"ti": "Ti"}.get(match[2].lower(), match[2].upper())
            resnet = f"{match[1].upper()}+" if match[1] else ""
            key = f"{resnet}{size}/{match[3]}"
    if key not in VARIANTS:
        raise ValueError(
            f"Unknown ViT variant {name!r}. Expected one of {', '.join(VARIANTS)} "
            f"(also spelled like 'ViT-B/16', 'ViT_B16' or 'R50+ViT-B_16')."
        )
    return VARIANTS[key]
