"""The PyTorch checkpoint layouts of ViTs on the Hugging Face Hub: timm's and transformers'.

Both are rewritten to the official layout (and timm's written from it) by explicit, exact
array maps: a torch `Linear` stores its weight as (out, in) where the official layout stores
(in, out); a `Conv2d` as (out, in, kh, kw) where it stores (kh, kw, in, out); timm fuses query,
key and value into one (3 D, D) `qkv` weight (heads major, as its `reshape(B, N, 3, H, d)`
reads it); transformers keeps them apart. Numbers of heads are not in the arrays: they come
from the file's `config.json`, else from the width of a paper variant. An array read from its
file on use (`keras_vit.weights.npz.Deferred`) is rewritten as it is read, so that a loader
holds one array at a time.

timm (`vit_base_patch16_224.augreg2_in21k_ft_in1k` and the other `VisionTransformer` files):

    cls_token, pos_embed, patch_embed.proj.{weight,bias}, blocks.{i}.norm1.{weight,bias},
    blocks.{i}.attn.qkv.{weight,bias}, blocks.{i}.attn.proj.{weight,bias},
    blocks.{i}.norm2.{weight,bias}, blocks.{i}.mlp.fc1.{weight,bias},
    blocks.{i}.mlp.fc2.{weight,bias}, norm.{weight,bias}, head.{weight,bias}

transformers (`google/vit-base-patch16-224`, `ViTForImageClassification` / `ViTModel`):

    vit.embeddings.{cls_token,position_embeddings}, vit.embeddings.patch_embeddings.projection,
    vit.encoder.layer.{i}.attention.attention.{query,key,value},
    vit.encoder.layer.{i}.attention.output.dense, vit.encoder.layer.{i}.intermediate.dense,
    vit.encoder.layer.{i}.output.dense, vit.encoder.layer.{i}.layernorm_{before,after},
    vit.layernorm, classifier (and pooler.dense, a tanh representation layer)
"""

import re

import numpy as np

from keras_vit import configs
from keras_vit.weights.errors import CheckpointError
from keras_vit.weights.layouts import BLOCK_KEY, POSEMB_KEY, RELATIVE_SUFFIX
from keras_vit.weights.npz import Deferred, derived

LAYOUTS = ("official", "timm", "transformers")
BLOCK = "Transformer/encoderblock_{}/"
_TIMM_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_HF_BLOCK = re.compile(r"^(?:vit\.)?encoder\.layer\.(\d+)\.")
# Features of files that keras_vit's ViT does not express, by a key that reveals them.
_UNSUPPORTED = {
    "dist_token": "a distillation token (distilled DeiT)",
    "reg_token": "register tokens",
    "blocks.0.ls1.gamma": "layer scale",
    "blocks.0.attn.q_norm.weight": "query/key normalisation",
    "attn_pool.latent": "attention pooling (MAP head)",
    "blocks.0.attn.q_bias": "separate query and value biases (BEiT style)",
    "norm_pre.weight": "a norm before the encoder (CLIP style)",
}


# The shapes of each layout's arrays, in the sizes D (width), M (MLP width), K (classes) and
# C (channels), each fixed by the first array that has it; None: any size. Checked before the
# arrays are rewritten, so that a malformed file is named by its array and shape.
_B = r"blocks\.\d+\."
TIMM_SHAPES = (
    (r"patch_embed\.proj\.weight", ("D", "C", None, None)),
    (r"patch_embed\.proj\.bias", ("D",)),
    (r"cls_token", (1, 1, "D")),
    (r"pos_embed", (1, None, "D")),
    (_B + r"attn\.qkv\.weight", ("3D", "D")),
    (_B + r"attn\.qkv\.bias", ("3D",)),
    (_B + r"attn\.proj\.weight", ("D", "D")),
    (_B + r"(norm1|norm2)\.(weight|bias)|" + _B + r"(attn\.proj|mlp\.fc2)\.bias|"
     r"(fc_)?norm\.(weight|bias)", ("D",)),
    (_B + r"mlp\.fc1\.weight", ("M", "D")),
    (_B + r"mlp\.fc1\.bias", ("M",)),
    (_B + r"mlp\.fc2\.weight", ("D", "M")),
    (r"head\.weight", ("K", "D")),
    (r"head\.bias", ("K",)),
)
_L = r"(vit\.)?encoder\.layer\.\d+\."
TRANSFORMERS_SHAPES = (
    (r"(vit\.)?embeddings\.patch_embeddings\.projection\.weight", ("D", "C", None, None)),
    (r"(vit\.)?embeddings\.patch_embeddings\.projection\.bias", ("D",)),
    (r"(vit\.)?embeddings\.(cls_token|mask_token)", (1, 1, "D")),
    (r"(vit\.)?embeddings\.position_embeddings", (1, None, "D")),
    (_L + r"attention\.(attention\.(query|key|value)|output\.dense)\.weight|"
     r"(vit\.)?pooler\.dense\.weight", ("D", "D")),
    (_L + r"(attention\.attention\.(query|key|value)|attention\.output\.dense|output\.dense)"
     r"\.bias|" + _L + r"layernorm_(before|after)\.(weight|bias)|"
     r"(vit\.)?layernorm\.(weight|bias)|(vit\.)?pooler\.dense\.bias", ("D",)),
    (_L + r"intermediate\.dense\.weight", ("M", "D")),
    (_L + r"intermediate\.dense\.bias", ("M",)),
    (_L + r"output\.dense\.weight", ("D", "M")),
    (r"classifier\.weight", ("K", "D")),
    (r"classifier\.bias", ("K",)),
)


def check_shapes(params, table, layout):
    """Raises unless every array of `params` that `table` ((key pattern, shape) pairs) names
    has its shape there (see `TIMM_SHAPES`).

    Raises:
        CheckpointError: naming the array, its shape and the shape expected.
    """
    sizes = {}
    for pattern, template in table:
        regex = re.compile(pattern)
        for key in sorted(k for k in params if regex.fullmatch(k)):
            shape = tuple(np.shape(params[key]))
            expected = []
            for size, dim in zip(template, shape + (None,) * len(template)):
                if isinstance(size, str):
                    factor, name = (3, size[1:]) if size.startswith("3") else (1, size)
                    if name not in sizes and dim is not None:
                        sizes[name] = dim // factor if dim % factor == 0 else -1
                    size = factor * sizes[name] if name in sizes else None
                expected.append(size)
            if len(shape) != len(template) or any(
                    size is not None and size != dim for size, dim in zip(expected, shape)):
                named = ", ".join(f"{n}={v}" for n, v in sizes.items() if v >= 0)
                shown = tuple("any" if size is None else size for size in expected)
                raise CheckpointError(
                    f"The {layout} checkpoint's {key!r} has shape {shape}. Expected "
                    f"{len(template)} axes, {shown}"
                    f"{f' (with {named})' if named else ''}.")


class _Source(dict):
    """A state dict that records which keys were read, so that none is silently dropped."""

    def __init__(self, params, layout):
        super().__init__(params)
        self.layout = layout
        self.read = set()

    def __getitem__(self, key):
        if key not in self:
            raise CheckpointError(f"The {self.layout} checkpoint has no {key!r}. Expected a "
                                  "complete ViT.")
        self.read.add(key)
        value = super().__getitem__(key)
        return value if isinstance(value, Deferred) else np.asarray(value)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def check_all_read(self):
        left = sorted(set(self) - self.read)
        if left:
            shown = ", ".join(left[:10]) + (f", ... ({len(left) - 10} more)" if len(left) > 10
                                            else "")
            raise CheckpointError(f"The {self.layout} checkpoint has arrays keras_vit's ViT has "
                                  f"no place for: {shown}. It cannot be loaded exactly.")


def detect_layout(keys):
    """"official", "timm" or "transformers", from the key names of a checkpoint."""
    keys = set(keys)
    if "cls_token" in keys or "patch_embed.proj.weight" in keys:
        return "timm"
    if any(k.startswith(("vit.embeddings.", "embeddings.patch_embeddings")) for k in keys):
        return "transformers"
    return "official"


# The array whose first (torch) or last (official) axis is the width, in each layout.
WIDTH_ARRAYS = {"timm": "patch_embed.proj.weight",
                "transformers": "embeddings.patch_embeddings.projection.weight",
                "official": "embedding/kernel"}


def layout_width(params, layout):
    """The transformer width of a checkpoint's arrays in `layout`.

    Raises:
        CheckpointError: if the array that gives it is missing.
    """
    key = WIDTH_ARRAYS[layout]
    found = [k for k in params if k.removeprefix("vit.") == key]
    if not found:
        raise CheckpointError(f"The {layout} checkpoint has no {key!r}. Expected a complete ViT.")
    shape = np.shape(params[found[0]])
    return int(shape[-1] if layout == "official" else shape[0])


def _linear(weight, shape=None):
    """A torch `Linear` weight (out, in) as an official kernel (in, out), reshaped to `shape`."""
    shape = shape or tuple(reversed(np.shape(weight)))
    return derived(weight, shape, lambda w: np.ascontiguousarray(w.T).reshape(shape))


def _conv(weight):
    out, channels, height, width = np.shape(weight)
    return derived(weight, (height, width, channels, out),
                   lambda w: np.ascontiguousarray(w.transpose(2, 3, 1, 0)))


def _reshaped(value, shape):
    return derived(value, shape, lambda v: v.reshape(shape))


def _thirds(value):
    """timm's fused query, key and value array split along its first axis."""
    size = np.shape(value)[0] // 3
    return [derived(value, (size, *np.shape(value)[1:]), lambda v, i=i: v[i * size:(i + 1) * size])
            for i in range(3)]


def _heads_for_width(width, num_heads):
    if num_heads:
        return int(num_heads)
    for size in configs.MODEL_SIZES.values():
        if size["hidden_size"] == width:
            return size["num_heads"]
    raise CheckpointError(
        f"The number of attention heads of a width-{width} checkpoint is not in its arrays, and "
        "no paper variant has this width. Expected a config.json beside the file (or pass "
        "--model / the architecture).")


def _check_supported(params):
    for key, feature in _UNSUPPORTED.items():
        if key in params:
            raise CheckpointError(f"The checkpoint has {feature} ({key!r}), which keras_vit's ViT "
                                  "does not express; it cannot be loaded exactly.")


def _attention(prefix, q, k, v, out_w, out_b, heads):
    """Official attention arrays from torch-style (out, in) projections (biases None: none)."""
    width = np.shape(q[0])[1]
    head_dim = width // heads
    params = {}
    for name, (weight, bias) in zip(("query", "key", "value"), (q, k, v)):
        params[f"{prefix}{name}/kernel"] = _linear(weight, (width, heads, head_dim))
        if bias is not None:
            params[f"{prefix}{name}/bias"] = _reshaped(bias, (heads, head_dim))
    params[f"{prefix}out/kernel"] = _linear(out_w, (heads, head_dim, width))
    params[f"{prefix}out/bias"] = out_b
    return params


def _norm(params, official, weight, bias):
    return {f"{official}/scale": params[weight], f"{official}/bias": params[bias]}


def _dense(params, official, weight, bias):
    return {f"{official}/kernel": _linear(params[weight]), f"{official}/bias": params[bias]}


def from_timm(params, num_heads=None):
    """timm's `VisionTransformer` state dict (NumPy arrays) in the official layout."""
    _check_supported(params)
    check_shapes(params, TIMM_SHAPES, "timm")
    params = _Source(params, "timm")
    width = np.shape(params["patch_embed.proj.weight"])[0]
    heads = _heads_for_width(width, num_heads)
    out = {"embedding/kernel": _conv(params["patch_embed.proj.weight"]),
           "embedding/bias": params["patch_embed.proj.bias"],
           POSEMB_KEY: params["pos_embed"]}
    if "cls_token" in params:
        out["cls"] = params["cls_token"]
    blocks = sorted({int(m[1]) for k in params if (m := _TIMM_BLOCK.match(k))})
    for i in blocks:
        b, o = f"blocks.{i}.", BLOCK.format(i)
        qkv_w = params[b + "attn.qkv.weight"]
        qkv_b = params.get(b + "attn.qkv.bias")
        split_b = _thirds(qkv_b) if qkv_b is not None else [None] * 3
        out.update(_attention(o + "MultiHeadDotProductAttention_1/",
                              *zip(_thirds(qkv_w), split_b),
                              params[b + "attn.proj.weight"], params[b + "attn.proj.bias"],
                              heads))
        out.update(_norm(params, o + "LayerNorm_0", b + "norm1.weight", b + "norm1.bias"))
        out.update(_norm(params, o + "LayerNorm_2", b + "norm2.weight", b + "norm2.bias"))
        out.update(_dense(params, o + "MlpBlock_3/Dense_0", b + "mlp.fc1.weight", b + "mlp.fc1.bias"))
        out.update(_dense(params, o + "MlpBlock_3/Dense_1", b + "mlp.fc2.weight", b + "mlp.fc2.bias"))
    if "fc_norm.weight" in params:  # the norm is on the pooled features (timm's norm: none)
        out.update(_norm(params, "fc_norm", "fc_norm.weight", "fc_norm.bias"))
    else:
        out.update(_norm(params, "Transformer/encoder_norm", "norm.weight", "norm.bias"))
    if "head.weight" in params and np.size(params["head.weight"]):
        out.update(_dense(params, "head", "head.weight", "head.bias"))
    params.check_all_read()
    return out


def to_timm(official):
    """An official-layout dict in timm's `VisionTransformer` layout (the inverse of
    `from_timm`), the layout of the `.safetensors` files timm loads.
    A model timm's `VisionTransformer` cannot hold (a hybrid's ResNet, `pre_logits`) is
    refused, naming the arrays."""
    official = _Source({k: np.asarray(v) for k, v in official.items()}, "official")
    if POSEMB_KEY not in official:
        if any(k.endswith("pos_embedding_row") for k in official):
            kind = "the learned 2-D position embedding (position_embedding='learned_2d')"
        elif any(k.endswith(RELATIVE_SUFFIX) for k in official):
            kind = "relative position embeddings (position_embedding='relative')"
        else:
            kind = "no learned position embedding (position_embedding='sincos_2d' or 'none')"
        raise CheckpointError(f"This model has {kind}; timm's VisionTransformer holds a learned "
                              f"1-D table ('pos_embed', from {POSEMB_KEY}) only: it cannot be "
                              "written in timm's layout.")
    out = {"patch_embed.proj.weight": official["embedding/kernel"].transpose(3, 2, 0, 1),
           "patch_embed.proj.bias": official["embedding/bias"],
           "pos_embed": official[POSEMB_KEY]}
    if "cls" in official:
        out["cls_token"] = official["cls"]
    blocks = sorted({int(m[1]) for k in official if (m := BLOCK_KEY.match(k))})
    for i in blocks:
        o, b = BLOCK.format(i), f"blocks.{i}."
        attention = o + "MultiHeadDotProductAttention_1/"
        kernels = [official[f"{attention}{n}/kernel"] for n in ("query", "key", "value")]
        width = kernels[0].shape[0]
        out[b + "attn.qkv.weight"] = np.concatenate([k.reshape(width, -1).T for k in kernels])
        if f"{attention}query/bias" in official:
            out[b + "attn.qkv.bias"] = np.concatenate(
                [official[f"{attention}{n}/bias"].reshape(-1) for n in ("query", "key", "value")])
        out[b + "attn.proj.weight"] = official[attention + "out/kernel"].reshape(-1, width).T
        out[b + "attn.proj.bias"] = official[attention + "out/bias"]
        for torch_name, name in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            out[f"{b}{torch_name}.weight"] = official[f"{o}{name}/scale"]
            out[f"{b}{torch_name}.bias"] = official[f"{o}{name}/bias"]
        for torch_name, name in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            out[f"{b}mlp.{torch_name}.weight"] = official[f"{o}MlpBlock_3/{name}/kernel"].T
            out[f"{b}mlp.{torch_name}.bias"] = official[f"{o}MlpBlock_3/{name}/bias"]
    official_norm, timm_norm = (("fc_norm", "fc_norm") if "fc_norm/scale" in official
                                else ("Transformer/encoder_norm", "norm"))
    out[f"{timm_norm}.weight"] = official[f"{official_norm}/scale"]
    out[f"{timm_norm}.bias"] = official[f"{official_norm}/bias"]
    if "head/kernel" in official:
        out["head.weight"] = official["head/kernel"].T
        out["head.bias"] = official["head/bias"]
    left = sorted(set(official) - official.read)
    if left:
        raise CheckpointError(f"timm's VisionTransformer has no place for {', '.join(left[:6])}"
                              f"{', ...' if len(left) > 6 else ''} (a hybrid's ResNet or a "
                              "pre_logits layer): this model cannot be written in timm's layout.")
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_transformers(params, num_heads=None):
    """transformers' `ViTModel` / `ViTForImageClassification` state dict in the official
    layout (the `vit.` prefix is optional; `pooler.dense` becomes `pre_logits`)."""
    check_shapes(params, TRANSFORMERS_SHAPES, "transformers")
    # The masked-image-modelling token is used in pre-training only (zero by default).
    params = _Source({k.removeprefix("vit."): v for k, v in params.items()
                      if k.removeprefix("vit.") != "embeddings.mask_token"}, "transformers")
    e = "embeddings."
    width = np.shape(params[e + "patch_embeddings.projection.weight"])[0]
    heads = _heads_for_width(width, num_heads)
    out = {"embedding/kernel": _conv(params[e + "patch_embeddings.projection.weight"]),
           "embedding/bias": params[e + "patch_embeddings.projection.bias"],
           "cls": params[e + "cls_token"],
           POSEMB_KEY: params[e + "position_embeddings"]}
    blocks = sorted({int(m[1]) for k in params if (m := _HF_BLOCK.match(k))})
    for i in blocks:
        b, o = f"encoder.layer.{i}.", BLOCK.format(i)
        a = b + "attention.attention."
        projections = [(params[f"{a}{n}.weight"], params.get(f"{a}{n}.bias"))
                       for n in ("query", "key", "value")]
        out.update(_attention(o + "MultiHeadDotProductAttention_1/", *projections,
                              params[b + "attention.output.dense.weight"],
                              params[b + "attention.output.dense.bias"], heads))
        out.update(_norm(params, o + "LayerNorm_0", b + "layernorm_before.weight",
                         b + "layernorm_before.bias"))
        out.update(_norm(params, o + "LayerNorm_2", b + "layernorm_after.weight",
                         b + "layernorm_after.bias"))
        out.update(_dense(params, o + "MlpBlock_3/Dense_0", b + "intermediate.dense.weight",
                          b + "intermediate.dense.bias"))
        out.update(_dense(params, o + "MlpBlock_3/Dense_1", b + "output.dense.weight",
                          b + "output.dense.bias"))
    out.update(_norm(params, "Transformer/encoder_norm", "layernorm.weight", "layernorm.bias"))
    if "pooler.dense.weight" in params:
        out.update(_dense(params, "pre_logits", "pooler.dense.weight", "pooler.dense.bias"))
    if "classifier.weight" in params:
        out.update(_dense(params, "head", "classifier.weight", "classifier.bias"))
    params.check_all_read()
    return out


def to_official(params, layout=None, num_heads=None):
    """`params` in the official layout, whichever of `LAYOUTS` it is in (detected if None)."""
    layout = layout or detect_layout(params)
    if layout == "timm":
        return from_timm(params, num_heads)
    if layout == "transformers":
        return from_transformers(params, num_heads)
    return params
