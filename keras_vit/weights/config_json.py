"""The `config.json` files beside checkpoints: keras_vit's own, timm's and transformers', read with
checks and compared with the arrays they describe; timm's written for the files keras_vit writes.

Every value a file states is checked before use (its type and range), and every value the
arrays also fix (width, depth, heads, MLP width, patch size, classes, class token, query/key/value
biases, resolution) must agree with them: an error names the file, the field and both values.
Checks name fields as the file does (`model_args.depth`, `num_hidden_layers`).

- keras_vit's (`keras_vit.training.fit` beside its checkpoints, and the metadata of the
  `.safetensors` files keras_vit writes): `{"format": "keras_vit", "model": keras_vit.ViT
  arguments, "class_names": [...], "preprocessing": the data config}` (`keras_vit_document`;
  `preprocessing`: timm's field names, `keras_vit.preprocessing.check_data_config`);
- timm's (`timm.models.push_to_hf_hub` / `save_for_hf`): `architecture`, `num_classes`,
  `global_pool`, `label_names`, `model_args` (the `VisionTransformer` arguments) and
  `pretrained_cfg`;
- transformers' (`ViTConfig`): `model_type`, `hidden_size`, `num_hidden_layers`, ...
"""

import json
import re

import numpy as np

from keras_vit import configs
from keras_vit.checks import (
    check_bool,
    check_choice,
    check_int,
    check_positive_int,
    check_positive_number,
    to_pair,
)
from keras_vit.preprocessing import (
    check_data_config,
    paper_data_config,
    timm_pretrained_cfg,
    with_image_size,
)
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.layouts import POSEMB_2D_KEYS, POSEMB_KEY, canonicalize, config_from_params

KERAS_VIT_FORMAT = "keras_vit"
# The file names of a Hugging Face model folder (a repository, or what timm's `save_for_hf`
# and transformers' `save_pretrained` write): the weights, and the config.json beside them.
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# Keys that configurations written by earlier versions hold and that are no arguments now: the
# execution routes (`kernels`, 0.3). They are dropped on reading.
LEGACY_ARGUMENTS = ("kernels",)
# The `ViT` arguments that are True or False (checked when read: a command line that overrides
# one would otherwise never see the file's value).
BOOL_ARGUMENTS = ("include_top", "dynamic_image_size", "qkv_bias", "fc_norm", "remat", "scan",
                  "gelu_approximate")
# timm's ViT defaults (`partial(nn.LayerNorm, eps=1e-6)`, exact GELU), and the `act_layer`
# names of the two GELU forms.
TIMM_LAYER_NORM_EPSILON = 1e-6
TIMM_GELU = {"gelu": False, "gelu_tanh": True}
# timm's `global_pool` values keras_vit's ViT expresses, as its `classifier`.
TIMM_POOLING = {"token": "token", "avg": "gap"}
# transformers' `hidden_act` values and the GELU form each names.
TRANSFORMERS_GELU = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True,
                     "gelu_fast": True}
TRANSFORMERS_LAYER_NORM_EPSILON = 1e-12  # ViTConfig's default
# Any timm ViT name serves: `model_args` set every size (timm's `create_model(name, **args)`).
TIMM_ARCHITECTURE = "vit_base_patch16_224"
WRITTEN_BY = "keras_vit"
RGB = 3


def parse_json(text, where, error=CheckpointError, expected=None):
    """The JSON value of `text` (str or bytes); `error` naming `where` (and what was
    `expected`) if it is not JSON, is nested too deeply, or is not UTF-8."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        reason = "JSON nested too deeply" if isinstance(e, RecursionError) else f"not JSON: {e}"
        raise error(f"{where} is unreadable ({reason})."
                    + (f" Expected {expected}." if expected else "")) from None


def read_json(path, expected, error=CheckpointError):
    """The JSON value in the file `path`: the one reader of keras_vit's JSON files.

    Args:
        path: str. The file.
        expected: str. What the file should be, for the message (e.g. "the config.json
            keras_vit.training.fit writes").
        error: the ValueError subclass to raise. Defaults to `CheckpointError`.

    Raises:
        error: naming the file and `expected`, if it cannot be read or is not JSON.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise error(f"{path} is unreadable ({e}). Expected {expected}.") from None
    return parse_json(data, path, error, expected)


def _checked(where, field, check, value, *args):
    """`check(field, value, *args)` (a `keras_vit.checks` rule), its error naming the file."""
    try:
        return check(field, value, *args)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def _object(where, field, value):
    if value is not None and not isinstance(value, dict):
        raise CheckpointError(f"{where}: `{field}` must be a JSON object. Received: "
                              f"{field}={value!r:.100}")
    return value or {}


def _names(where, field, value):
    """A list of class names (str), or None."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise CheckpointError(f"{where}: `{field}` must be a list of class names (strings). "
                              f"Received: {field}={value!r:.100}")
    return value


def _rgb(field, value):
    if check_int(field, value) != RGB:
        raise ValueError(f"`{field}` must be {RGB} (RGB images). Received: {field}={value!r}")
    return value


def _input_size(field, value):
    """timm's `pretrained_cfg.input_size` [3, height, width] as (height, width)."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"`{field}` must be [3, height, width]. Received: {field}={value!r}")
    _rgb(field, value[0])
    return to_pair(field, value[1:])


class Declared:
    """The `keras_vit.ViT` arguments a config file states, checked, with the field each came
    from (for messages); two fields of one file that state an argument must agree."""

    def __init__(self, where):
        self.where = where
        self.values, self.fields = {}, {}

    def take(self, argument, field, value, check, *args):
        if value is None:  # not stated (timm writes None for "the default")
            return
        value = _checked(self.where, field, check, value, *args)
        if isinstance(value, tuple):
            value = list(value)
        if argument in self.values and self.values[argument] != value:
            raise CheckpointError(
                f"{self.where}: {field} {value!r} contradicts {self.fields[argument]} "
                f"{self.values[argument]!r}.")
        self.values.setdefault(argument, value)
        self.fields.setdefault(argument, field)

    def get(self, argument, default=None):
        return self.values.get(argument, default)

    def contradiction(self, argument, value, source):
        return CheckpointError(
            f"{self.where}: {self.fields[argument]} {self.values[argument]!r} contradicts "
            f"{source} ({value!r}).")


# ---------------------------------------------------------------------------------------------
# keras_vit's own.


def keras_vit_document(config, class_names=None, preprocessing=None):
    """keras_vit's configuration document for a model: its `keras_vit.ViT` arguments
    (`config`; None for a model it did not build), class names and data config (None: the
    paper's, written out at the model's resolution), as `check_keras_vit` reads it."""
    if preprocessing is None and config is not None:
        preprocessing = paper_data_config(config["image_size"])
    return {"format": KERAS_VIT_FORMAT, "model": config,
            "class_names": list(class_names) if class_names else None,
            "preprocessing": preprocessing and check_data_config(dict(preprocessing))}


def check_keras_vit(document, where):
    """A keras_vit configuration document, checked: `{"format": "keras_vit", "model": ViT
    arguments or None, "class_names": [...] or None, "preprocessing": a data config or None}`;
    its arguments' values are checked when the model is built (`keras_vit.ViT`).

    Raises:
        CheckpointError: naming `where` and the field.
    """
    model = {key: value for key, value in _object(where, "model", document.get("model")).items()
             if key not in LEGACY_ARGUMENTS}
    unknown = sorted(set(model) - set(configs.VIT_ARGUMENTS))
    if unknown:
        raise CheckpointError(f"{where}: `model` has keys that are not keras_vit.ViT arguments: "
                              f"{unknown}. Expected some of {', '.join(configs.VIT_ARGUMENTS)}.")
    for name in BOOL_ARGUMENTS:
        if name in model:
            _checked(where, f"model.{name}", check_bool, model[name])
    names = _names(where, "class_names", document.get("class_names"))
    classes = model.get("num_classes")
    if names and model.get("include_top", True) and isinstance(classes, int) \
            and len(names) != classes:
        raise CheckpointError(f"{where}: `class_names` has {len(names)} names but "
                              f"`model.num_classes` is {classes}.")
    preprocessing = document.get("preprocessing")
    if preprocessing is not None:
        preprocessing = _checked(where, "preprocessing", _data_config, preprocessing)
    return dict(document, model=model or None, class_names=names, preprocessing=preprocessing)


def _data_config(field, value):
    """`keras_vit.preprocessing.check_data_config` as a `keras_vit.checks` rule."""
    return check_data_config(value, f"`{field}`")


def declared_keras_vit(model, where):
    """The `Declared` arguments of a keras_vit configuration's `model`."""
    declared = Declared(where)
    for argument, value in model.items():
        declared.values[argument] = list(value) if isinstance(value, tuple) else value
        declared.fields[argument] = f"model.{argument}"
    return declared


# ---------------------------------------------------------------------------------------------
# timm's.


# timm's VisionTransformer arguments keras_vit reads: (keras_vit name, timm name, check, its
# extra arguments). The first ones timm also copies to the top level of its config.json.
TIMM_ARGUMENTS = (
    ("hidden_size", "embed_dim", check_positive_int, ()),
    ("num_layers", "depth", check_positive_int, ()),
    ("num_heads", "num_heads", check_positive_int, ()),
    ("patch_size", "patch_size", to_pair, ()),
    ("image_size", "img_size", to_pair, ()),
    ("num_classes", "num_classes", check_int, (0,)),
    ("mlp_ratio", "mlp_ratio", check_positive_number, ()),
    ("qkv_bias", "qkv_bias", check_bool, ()),
    ("global_pool", "global_pool", check_choice, (tuple(TIMM_POOLING),)),
)
TIMM_MODEL_ARGUMENTS = (
    ("class_token", "class_token", check_bool, ()),
    ("fc_norm", "fc_norm", check_bool, ()),
    ("act_layer", "act_layer", check_choice, (tuple(TIMM_GELU),)),
    ("dynamic_image_size", "dynamic_img_size", check_bool, ()),
    ("in_chans", "in_chans", _rgb, ()),
)


def timm_layout(document):
    """A timm `config.json` document in timm's current layout. timm's older single dict (an
    `architecture`, and neither `pretrained_cfg` nor the later `model_args`: the preprocessing
    at the top level) is what timm (`timm.models._hub`) still reads as the `pretrained_cfg`,
    `labels` as `label_names`; its `num_classes` and `label_names` stay at the top too. Any
    other document is returned as is.
    """
    if not isinstance(document, dict) or "architecture" not in document \
            or "pretrained_cfg" in document or "model_args" in document:
        return document
    pretrained = {key: value for key, value in document.items()
                  if key not in ("architecture", "num_features")}
    if "labels" in pretrained:
        pretrained["label_names"] = pretrained.pop("labels")
    top = {key: pretrained[key] for key in ("num_classes", "label_names") if key in pretrained}
    return dict(architecture=document["architecture"], pretrained_cfg=pretrained, **top)


def declared_timm(config, where):
    """The `Declared` arguments of timm's `config.json`, and its class names."""
    args = _object(where, "model_args", config.get("model_args"))
    pretrained = _object(where, "pretrained_cfg", config.get("pretrained_cfg"))
    declared = Declared(where)
    for argument, name, check, extra in TIMM_ARGUMENTS:
        declared.take(argument, name, config.get(name), check, *extra)
    for argument, name, check, extra in TIMM_ARGUMENTS + TIMM_MODEL_ARGUMENTS:
        declared.take(argument, f"model_args.{name}", args.get(name), check, *extra)
    # timm builds the model from `model_args` and overrides `pretrained_cfg.num_classes` with
    # the top-level `num_classes`: `pretrained_cfg` speaks only where they are silent.
    if "image_size" not in declared.values:
        declared.take("image_size", "pretrained_cfg.input_size", pretrained.get("input_size"),
                      _input_size)
    if "num_classes" not in declared.values:
        declared.take("num_classes", "pretrained_cfg.num_classes",
                      pretrained.get("num_classes"), check_int, 0)
    architecture = config.get("architecture")
    if architecture is not None and not isinstance(architecture, str):
        raise CheckpointError(f"{where}: `architecture` must be a timm model name. Received: "
                              f"architecture={architecture!r:.100}")
    return declared, _names(where, "label_names", config.get("label_names"))


def timm_size(architecture):
    """The paper's model size ("Ti" ... "H") of a timm name such as "vit_small_patch8_224"."""
    sizes = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}
    match = re.match(r"vit_(tiny|small|base|large|huge)_patch\d+", architecture or "")
    return sizes[match[1]] if match else None


def timm_heads(config, declared):
    """The number of heads timm's config gives: `model_args.num_heads`, else its
    architecture's (a paper size), else None."""
    heads = declared.get("num_heads")
    size = timm_size(config.get("architecture"))
    if heads is None and size:
        heads = configs.MODEL_SIZES[size]["num_heads"]
    return heads


def timm_differences(config):
    """How timm would build a `keras_vit.ViT` configuration otherwise than it is, from the
    `config.json` `timm_config` writes: timm's LayerNorm epsilon is 1e-6 (one within 1e-6 of it
    gives the same float32 answers), and a model of any input size resizes its position
    embedding as timm does (bicubic). Empty where none."""
    differences = []
    # An epsilon nearer 1e-6 than 1e-6 (transformers' 1e-12) changes nothing float32 holds.
    if abs(config["layer_norm_epsilon"] - TIMM_LAYER_NORM_EPSILON) > TIMM_LAYER_NORM_EPSILON:
        differences.append(f"LayerNorm epsilon {TIMM_LAYER_NORM_EPSILON:g} (this model's: "
                           f"{config['layer_norm_epsilon']:g})")
    if config["dynamic_image_size"] and config["position_resize"] != "bicubic":
        differences.append("a position embedding resized bicubically at other input sizes "
                           f"(this model's: {config['position_resize']})")
    return differences


def timm_options(declared, params):
    """The `keras_vit.ViT` options timm's config sets that the arrays do not show."""
    options = dict(gelu_approximate=TIMM_GELU[declared.get("act_layer", "gelu")],
                   layer_norm_epsilon=TIMM_LAYER_NORM_EPSILON, position_resize="bicubic")
    if TIMM_POOLING[declared.get("global_pool", "token")] == "gap":
        # The average of the patch tokens, beside a class token where the file has one.
        options.update(classifier="gap", class_token="cls" in params)
    if declared.get("dynamic_image_size"):
        options["dynamic_image_size"] = True
    return options


def timm_config(config, class_names=None, preprocessing=None):
    """The `config.json` timm writes for a `VisionTransformer` (`save_for_hf`), for a
    `keras_vit.ViT` configuration its layout holds (see `torch_layouts.to_timm`), so that
    `timm.create_model(architecture, pretrained=True, **model_args)` builds the same network
    (timm's LayerNorm epsilon is 1e-6; keras_vit's files also carry their exact configuration)
    and `timm.data.resolve_data_config` gives the model's data config (`preprocessing`; None:
    the paper's).

    Raises:
        CheckpointError: if timm's arguments cannot express the MLP width.
    """
    width, mlp_dim = config["hidden_size"], config["mlp_dim"]
    if int(width * (mlp_dim / width)) != mlp_dim:
        raise CheckpointError(f"timm's VisionTransformer sets its MLP width as int(embed_dim * "
                              f"mlp_ratio), which cannot give mlp_dim {mlp_dim} for width "
                              f"{width}: this model cannot be described to timm.")
    image, patch = to_pair("image_size", config["image_size"]), \
        to_pair("patch_size", config["patch_size"])
    num_classes = config["num_classes"] if config["include_top"] else 0
    pool = {v: k for k, v in TIMM_POOLING.items()}[config["classifier"]]
    args = dict(img_size=list(image), patch_size=patch[0] if patch[0] == patch[1] else list(patch),
                embed_dim=width, depth=config["num_layers"], num_heads=config["num_heads"],
                mlp_ratio=mlp_dim / width, qkv_bias=config["qkv_bias"],
                class_token=config["class_token"], global_pool=pool, fc_norm=config["fc_norm"],
                num_classes=num_classes, in_chans=RGB,
                act_layer="gelu_tanh" if config["gelu_approximate"] else "gelu",
                dynamic_img_size=config["dynamic_image_size"])
    preprocessing = with_image_size(
        check_data_config(dict(preprocessing)) if preprocessing is not None
        else paper_data_config(image), image)
    pretrained = dict(timm_pretrained_cfg(preprocessing),
                      fixed_input_size=not config["dynamic_image_size"], num_classes=num_classes,
                      first_conv="patch_embed.proj", classifier="head")
    # `preprocessing`, keras_vit's field (timm reads only its own): the whole data config,
    # `antialias` included, which timm's `pretrained_cfg` cannot hold.
    document = dict(architecture=TIMM_ARCHITECTURE, num_classes=num_classes, num_features=width,
                    global_pool=pool, model_args=args, pretrained_cfg=pretrained,
                    preprocessing=dict(preprocessing), written_by=WRITTEN_BY)
    if class_names:
        document["label_names"] = list(class_names)
    return document


# ---------------------------------------------------------------------------------------------
# transformers'.


def declared_transformers(config, where):
    """The `Declared` arguments of transformers' `config.json` (`ViTConfig`), its options
    (GELU form, LayerNorm epsilon) and its class names."""
    model_type = config.get("model_type", "vit")
    if model_type != "vit":
        raise CheckpointError(f"{where}: model_type {model_type!r} is not a ViT; keras_vit reads "
                              "transformers' 'vit' models. Expected model_type 'vit'.")
    declared = Declared(where)
    for argument, name, check in (("hidden_size", "hidden_size", check_positive_int),
                                  ("num_layers", "num_hidden_layers", check_positive_int),
                                  ("num_heads", "num_attention_heads", check_positive_int),
                                  ("mlp_dim", "intermediate_size", check_positive_int),
                                  ("patch_size", "patch_size", to_pair),
                                  ("image_size", "image_size", to_pair),
                                  ("qkv_bias", "qkv_bias", check_bool),
                                  ("in_chans", "num_channels", _rgb)):
        declared.take(argument, name, config.get(name), check)
    act = _checked(where, "hidden_act", check_choice, config.get("hidden_act", "gelu"),
                   tuple(TRANSFORMERS_GELU))
    epsilon = _checked(where, "layer_norm_eps", check_positive_number,
                       config.get("layer_norm_eps", TRANSFORMERS_LAYER_NORM_EPSILON))
    options = dict(gelu_approximate=TRANSFORMERS_GELU[act], layer_norm_epsilon=epsilon)
    return declared, options, _id2label(where, config.get("id2label"))


def _id2label(where, labels):
    """Class names from transformers' `id2label` ({"0": name, ...}), or None."""
    labels = _object(where, "id2label", labels)
    if not labels:
        return None
    names = [labels.get(str(i)) for i in range(len(labels))]
    if not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{where}: `id2label` must map \"0\" ... \"{len(labels) - 1}\" to "
                              f"class names. Received keys {sorted(labels)[:10]}.")
    return names


# ---------------------------------------------------------------------------------------------
# Agreement with the arrays.


def _posemb_grid(params, class_token):
    """The number of patch positions of a learned position embedding, or None."""
    if POSEMB_KEY in params:
        return int(np.shape(params[POSEMB_KEY])[1]) - int(class_token)
    if all(k in params for k in POSEMB_2D_KEYS):
        rows, cols = (int(np.shape(params[k])[1]) for k in POSEMB_2D_KEYS)
        return rows * cols
    return None


def check_agreement(declared, params, source):
    """Raises unless every argument `declared` states that the arrays also fix agrees with
    them: width, depth, heads (official layout), MLP width, patch size, classes (of a head),
    class token, query/key/value biases, the ResNet, and the resolution (the learned position
    embedding's grid). `source`: the arrays' file, for messages.

    Raises:
        CheckpointError: naming the field, its value and the arrays'.
    """
    canonical, big_vision = canonicalize(params)
    arrays = config_from_params(canonical, declared.get("image_size"))
    has_cls = "cls" in canonical
    facts = {name: arrays[name] for name in ("hidden_size", "num_layers", "num_heads", "mlp_dim",
                                             "representation_size")}
    facts.update(qkv_bias=arrays.get("qkv_bias", True), resnet=arrays.get("resnet"))
    facts["patch_size"] = list(arrays["patch_size"])
    facts["class_token"] = has_cls
    if arrays["include_top"] and declared.get("include_top", True):
        facts["num_classes"] = arrays["num_classes"]
    for name, value in facts.items():
        stated = declared.get(name)
        if stated is None:
            continue
        if name == "patch_size":
            stated = list(_checked(declared.where, declared.fields[name], to_pair, stated))
        if name == "resnet" and isinstance(stated, dict) and value is not None:
            stated = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in stated.items()
                      if k in value}
            value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
        if stated != value:
            raise declared.contradiction(name, value, f"the arrays of {source}")
    if declared.get("mlp_ratio") is not None:
        width = declared.get("hidden_size", arrays["hidden_size"])
        if int(width * declared.get("mlp_ratio")) != arrays["mlp_dim"]:
            raise declared.contradiction("mlp_ratio", arrays["mlp_dim"],
                                         f"the MLP width of the arrays of {source}")
    if declared.get("global_pool") == "token" and not has_cls:
        raise declared.contradiction("global_pool", "no class token",
                                     f"the arrays of {source}")
    _check_resolution(declared, canonical, arrays, has_cls and not big_vision, source)


def _check_resolution(declared, params, arrays, posemb_has_cls, source):
    """The declared image size gives the grid the learned position embedding holds."""
    size = declared.get("image_size")
    positions = _posemb_grid(params, posemb_has_cls)
    if size is None or positions is None:
        return
    resnet = arrays.get("resnet")
    stride = 4 * 2 ** max(len(resnet["num_layers"]) - 1, 0) if resnet else 1
    height, width = _checked(declared.where, declared.fields["image_size"], to_pair, size)
    patch = arrays["patch_size"]
    grid = (height // (patch[0] * stride), width // (patch[1] * stride))
    if grid[0] * grid[1] != positions:
        raise declared.contradiction(
            "image_size", f"{positions} positions",
            f"the position embedding of {source} (a {grid[0]}x{grid[1]} grid of patches at that "
            "size)")


def check_class_names(names, config, where):
    """Raises unless class names (or None) fit the classes of a `keras_vit.ViT` configuration
    with a head: one name per class.

    Raises:
        CheckpointError: naming `where`, the number of names and of classes.
    """
    classes = config.get("num_classes")
    if names is not None and config.get("include_top", True) and isinstance(classes, int) \
            and len(names) != classes:
        raise CheckpointError(f"{where} gives {len(names)} class names for a head of {classes} "
                              "classes. Expected one name per class.")
    return names


def check_heads_divide(heads, width, source, weights_path):
    """`heads` (stated by `source`) as an int, if it is a number of attention heads that
    divides the arrays' `width`.

    Raises:
        CheckpointError: naming `source`, the value and the width.
    """
    if isinstance(heads, (bool, np.bool_)) or not isinstance(heads, (int, np.integer)) \
            or heads < 1 or width % heads:
        divisors = [d for d in range(1, width + 1) if width % d == 0]
        raise CheckpointError(
            f"{source} {heads!r} does not fit the arrays of {weights_path}: expected a number "
            f"of attention heads that divides their width {width} (one of "
            f"{', '.join(map(str, divisors[:12]))}{', ...' if len(divisors) > 12 else ''}).")
    return int(heads)


# What decides the model timm builds from a config.json and its preprocessing, by path:
# compared where both files state it (`check_describes`).
TIMM_DECIDING = (("architecture",), ("num_classes",), ("global_pool",), ("label_names",),
                 *(("pretrained_cfg", key) for key in (
                     "input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")))


def check_describes(config, expected, where, source):
    """Raises unless the `config.json` document `config` (read from `where`) states what
    `expected`, the one keras_vit writes for the file `source` (`timm_config`), states, in
    every field that decides timm's model or preprocessing and both hold (each of `model_args`
    and of keras_vit's `preprocessing` too): a config.json edited, or written for another file,
    would have timm build another model than keras_vit from the folder."""
    paths = list(TIMM_DECIDING) + [(field, key) for field in ("model_args", "preprocessing")
                                   for key in expected[field]]
    for path in paths:
        mine, theirs = expected, config
        for key in path:
            mine = mine.get(key) if isinstance(mine, dict) else None
            theirs = theirs.get(key) if isinstance(theirs, dict) else None
        if mine is None or theirs is None:
            continue
        if json.loads(json.dumps(mine)) != theirs:
            raise CheckpointError(
                f"{where}: {'.'.join(path)} {theirs!r:.80} contradicts the keras_vit metadata of "
                f"{source} ({mine!r:.80}): timm would build or preprocess another model from the "
                "folder. "
                "Expected the config.json written with that file (write it again with `keras-vit "
                "convert`), or the file in a folder of its own.")


# Arguments two configuration files of one checkpoint may both state.
SHARED_ARGUMENTS = ("hidden_size", "num_layers", "num_heads", "patch_size", "image_size",
                    "qkv_bias", "class_token", "fc_norm", "dynamic_image_size")


def check_same(first, second):
    """Raises unless two `Declared` (a config.json and keras_vit's metadata of one file) state
    the same value for every argument both state."""
    for argument in SHARED_ARGUMENTS:
        a, b = first.get(argument), second.get(argument)
        if a is None or b is None:
            continue
        if argument in ("patch_size", "image_size"):
            a = list(_checked(first.where, first.fields[argument], to_pair, a))
            b = list(_checked(second.where, second.fields[argument], to_pair, b))
        if a != b:
            raise CheckpointError(f"{first.where}: {first.fields[argument]} {a!r} contradicts "
                                  f"{second.where} ({second.fields[argument]} {b!r}).")
