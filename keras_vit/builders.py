"""Building models by name: `create_model("B/16")`, `ViT_B16(...)`, `from_pretrained(source)`.

The variants are data (`keras_vit.configs.VARIANTS`); each named builder is a one-line call of
`create_model`, which calls the one generic builder `keras_vit.ViT` and, with `pretrained=`,
loads weights through `keras_vit.weights`. `from_pretrained` builds the architecture a
checkpoint describes (`keras_vit.weights.architecture.checkpoint_config`).
"""

from keras_vit import configs, data_config
from keras_vit.framework import FirstValues
from keras_vit.model import ViT
from keras_vit.weights import (
    CheckpointError,
    default_checkpoint,
    fetch_params,
    get_checkpoint,
    load_params,
)
from keras_vit.weights.architecture import checkpoint_config
from keras_vit.weights.loading import file_grid, match_params
from keras_vit.weights.registry import is_registered
from keras_vit.weights.sources import checkpoint_file


# The `ViT` arguments that say what a checkpoint computes rather than its sizes: a named
# builder given such a checkpoint (timm's files, a config.json beside a file) takes them from
# it, where the caller does not pass them.
CHECKPOINT_FUNCTIONS = ("classifier", "gelu_approximate", "layer_norm_epsilon", "qkv_bias",
                        "class_token", "fc_norm", "position_embedding")


def _new_model(kwargs, entry, described_by=None):
    """`ViT(**kwargs)`. When the registry entry's classifier is kept whole, its representation
    layer is built too (the released network). An argument `ViT` refuses is reported as
    `described_by`'s (the file that gave the architecture), where there is one."""
    same_head = kwargs.get("include_top", True) and entry and \
        kwargs.get("num_classes") == entry.get("num_classes")
    if same_head and entry.get("representation_size") and "representation_size" not in kwargs:
        kwargs = dict(kwargs, representation_size=entry["representation_size"])
    try:
        return ViT(**kwargs)
    except (ValueError, TypeError) as e:
        if described_by is None:
            raise
        raise CheckpointError(f"The architecture {described_by} describes (with the arguments "
                              f"given) cannot be built: {e}") from None


def _fetch_into_new_model(source, architecture, progress=True, num_heads=None):
    """Reads a checkpoint into the model `architecture(params, entry)` gives: `(kwargs, class
    names, described_by, the file's image size or None)` (see `_new_model`; a position
    embedding is resized from the file's grid where its image size gives it, else from a
    square grid). The model is built, and keys and shapes checked
    against it, from the file's headers, before any array is read. The model carries the
    checkpoint's data config (`keras_vit.data_config.attach`).

    Returns:
        (model, loading report, registry entry, class names).
    """
    built = {}
    # The model is new: a refusal part-way drops it, so the file is read once, as it is
    # loaded, and its variables take the file's values as their first.
    with FirstValues() as first:
        def build(placeholders, entry):
            kwargs, names, described_by, file_size = architecture(placeholders, entry)
            with first.creating():
                model = _new_model(kwargs, entry, described_by)
            grid = file_grid(model, file_size)
            match_params(model, placeholders, str(source), check_values=False,
                         source_grid=grid)
            built.update(model=model, names=names, grid=grid)

        params, entry = fetch_params(source, progress=progress, num_heads=num_heads,
                                     check=build, verify=False)
        report = load_params(built["model"], params, source=str(source), new_model=True,
                             assign=first.assign, source_grid=built["grid"])
    data_config.attach(built["model"], source, entry)
    return built["model"], report, entry, built["names"]


def build_from_checkpoint(source, progress=True, **overrides):
    """`from_pretrained`, returning also what was learnt on the way.

    Returns:
        (model, info): info has `entry` (the registry entry or None), `report` (the loading
        report: `skipped` file keys and `fresh` model layers), `class_names` (the file's
        names where known, else None) and `num_classes` (the file's head size, or None).
    """
    source = checkpoint_file(source)

    def architecture(params, entry):
        config, class_names, described_by, file_size = checkpoint_config(
            params, entry, source, overrides.get("image_size"))
        file_classes = config.get("num_classes") if config.get("include_top", True) else None
        if overrides.get("num_classes") is not None and "include_top" not in overrides \
                and not config.get("include_top", True):  # it would be ignored
            raise ValueError(f"num_classes={overrides['num_classes']!r} asks for a head, but "
                             f"{source} describes a model without one (include_top=False). "
                             "Expected include_top=True with it, for a new head.")
        kwargs = dict(config, **overrides)
        if kwargs.get("num_classes") != file_classes:
            class_names = None  # the names belong to the file's head
        return kwargs, (class_names, file_classes), described_by, file_size

    model, report, entry, (class_names, file_classes) = _fetch_into_new_model(
        source, architecture, progress, overrides.get("num_heads"))
    return model, dict(entry=entry, report=report, class_names=class_names,
                       num_classes=file_classes)


def create_model(variant, image_size=224, num_classes=1000, include_top=True, pretrained=False,
                 **overrides):
    """Builds a paper variant by name, e.g. `create_model("B/16")`.

    Args:
        variant: str. A name from `keras_vit.configs.VARIANTS`, in any common spelling
            ("B/16", "ViT-B/16", "ViT_B16").
        image_size: int or (height, width). Defaults to 224.
        num_classes: int. Defaults to 1000.
        include_top: bool. Defaults to True.
        pretrained: False, True (the variant's default checkpoint, see
            `keras_vit.default_checkpoint`), a registry name, a local path or a URL. Loads the
            weights all or nothing (see `keras_vit.load_pretrained`). Defaults to False.
        **overrides: any other argument of `keras_vit.ViT` (e.g. `dropout_rate`,
            `representation_size`, `classifier`).
    """
    spec = configs.get_variant(variant)
    kwargs = dict(spec.config(), image_size=image_size, num_classes=num_classes,
                  include_top=include_top, name=spec.builder_name.lower())
    kwargs.update(overrides)
    if pretrained is False or pretrained is None:
        return ViT(**kwargs)
    if pretrained is True:
        pretrained = default_checkpoint(spec, image_size, num_classes, include_top)
    if is_registered(pretrained):  # before downloading anything
        variant = get_checkpoint(pretrained)["variant"]
        if variant and variant != spec.name:
            raise ValueError(f"Checkpoint {pretrained!r} is a ViT-{variant} checkpoint; "
                             f"{spec.builder_name} builds ViT-{spec.name}.")

    def architecture(params, entry):
        # What the checkpoint computes (its activation, norms, pooling) comes with its weights,
        # unless the caller chose otherwise: the variant gives only the sizes.
        declared = (entry or {}).get("config") or {}
        taken = {key: declared[key] for key in CHECKPOINT_FUNCTIONS
                 if key in declared and key not in overrides}
        return dict(kwargs, **taken), None, None, declared.get("image_size")

    return _fetch_into_new_model(pretrained, architecture)[0]


def from_pretrained(source, progress=True, **overrides):
    """Builds the model a checkpoint describes and loads it: no architecture to spell out.

    Args:
        source: a registry name (e.g. "digits", "imagenet21k/ViT-B_16"), a local `.npz` path
            or a URL. The architecture comes from the registry entry (a paper variant at the
            entry's resolution and classes, or its `config`), else from the `config.json`
            that `keras_vit.training.fit` writes beside its checkpoints, else from the file's
            array shapes (`keras_vit.weights.config_from_params`, hybrids included).
        progress: bool. While a URL downloads, say which on stderr, and draw a bar where
            standard output is a terminal or a notebook. Defaults to True. `huggingface_hub`'s
            bars of an `hf://` download show where standard error is one, and not with False
            (its `HF_HUB_DISABLE_PROGRESS_BARS` wins where set).
        **overrides: keyword arguments. Arguments of `keras_vit.ViT` to change (e.g.
            `image_size`, `num_classes`, `include_top`); position embeddings and head follow
            the usual loading rules.

    Examples:
    >>> model = from_pretrained("digits")  # the shipped demo, 10 classes at 16x16
    """
    return build_from_checkpoint(source, progress, **overrides)[0]


def _variant_builder(variant_name):
    spec = configs.VARIANTS[variant_name]

    def builder(image_size=224, num_classes=1000, include_top=True, pretrained=False, **overrides):
        return create_model(spec.name, image_size=image_size, num_classes=num_classes,
                            include_top=include_top, pretrained=pretrained, **overrides)

    size = configs.MODEL_SIZES[spec.size]
    builder.__name__ = builder.__qualname__ = spec.builder_name
    stem = f"ResNet stages {spec.resnet} then " if spec.resnet is not None else ""
    builder.__doc__ = (
        f"ViT-{spec.name}: {stem}patch {spec.patch_size}, width {size['hidden_size']}, "
        f"{size['num_layers']} layers, {size['num_heads']} heads, MLP {size['mlp_dim']}; "
        f"{spec.params:,} parameters at 224 px with 1000 classes.\n\n"
        "Args: image_size, num_classes, include_top, pretrained and any override of "
        "`keras_vit.ViT`; see `keras_vit.create_model`."
    )
    return builder


ViT_Ti16 = _variant_builder("Ti/16")
ViT_S16 = _variant_builder("S/16")
ViT_S32 = _variant_builder("S/32")
ViT_B8 = _variant_builder("B/8")
ViT_B16 = _variant_builder("B/16")
ViT_B32 = _variant_builder("B/32")
ViT_L16 = _variant_builder("L/16")
ViT_L32 = _variant_builder("L/32")
ViT_H14 = _variant_builder("H/14")
ViT_R50_B16 = _variant_builder("R50+B/16")
ViT_R50_L32 = _variant_builder("R50+L/32")
ViT_R26_B32 = _variant_builder("R26+B/32")
ViT_R26_S32 = _variant_builder("R26+S/32")
ViT_R_Ti16 = _variant_builder("R+Ti/16")
