"""An independent NumPy forward pass of ViT, written from the paper and the official code.

It reads parameters in the official checkpoint layout (keys as in ../shared/VIT_REFERENCE.md)
and shares no code with keras_vit. Computed in float64.
"""

import math

import numpy as np

_erf = np.vectorize(math.erf)


def official_params(
    rng,
    *,
    hidden,
    mlp,
    heads,
    layers,
    patch,
    grid,
    channels=3,
    num_classes=None,
    classifier="token",
    representation=None,
    scale=0.2,
):
    """Random parameters in the official .npz layout (float32), with non-trivial values.

    grid: (rows, cols) of patches the position embedding covers.
    """
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    k = hidden // heads
    n = grid[0] * grid[1] + (1 if classifier == "token" else 0)

    def r(*shape, s=scale):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    p = {
        "embedding/kernel": r(ph, pw, channels, hidden, s=1 / math.sqrt(ph * pw * channels)),
        "embedding/bias": r(hidden),
        "Transformer/posembed_input/pos_embedding": r(1, n, hidden),
        "Transformer/encoder_norm/scale": 1 + r(hidden),
        "Transformer/encoder_norm/bias": r(hidden),
    }
    if classifier == "token":
        p["cls"] = r(1, 1, hidden)
    for i in range(layers):
        b = f"Transformer/encoderblock_{i}/"
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            p[b + ln + "/scale"] = 1 + r(hidden)
            p[b + ln + "/bias"] = r(hidden)
        a = b + "MultiHeadDotProductAttention_1/"
        for proj in ("query", "key", "value"):
            p[a + proj + "/kernel"] = r(hidden, heads, k, s=1 / math.sqrt(hidden))
            p[a + proj + "/bias"] = r(heads, k)
        p[a + "out/kernel"] = r(heads, k, hidden, s=1 / math.sqrt(hidden))
        p[a + "out/bias"] = r(hidden)
        p[b + "MlpBlock_3/Dense_0/kernel"] = r(hidden, mlp, s=1 / math.sqrt(hidden))
        p[b + "MlpBlock_3/Dense_0/bias"] = r(mlp)
        p[b + "MlpBlock_3/Dense_1/kernel"] = r(mlp, hidden, s=1 / math.sqrt(mlp))
        p[b + "MlpBlock_3/Dense_1/bias"] = r(hidden)
    width = hidden
    if representation:
        p["pre_logits/kernel"] = r(hidden, representation, s=1 / math.sqrt(hidden))
        p["pre_logits/bias"] = r(representation)
        width = representation
    if num_classes:
        p["head/kernel"] = r(width, num_classes, s=1 / math.sqrt(width))
        p["head/bias"] = r(num_classes)
    return p


def layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu(x, approximate=True):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def patchify(images, kernel, bias):
    """Non-overlapping patches times the flattened conv kernel: a VALID conv with stride=size."""
    b, h, w, c = images.shape
    ph, pw, _, d = kernel.shape
    x = images.reshape(b, h // ph, ph, w // pw, pw, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, (h // ph) * (w // pw), ph * pw * c)  # row-major patch order
    return x @ kernel.reshape(ph * pw * c, d) + bias


def encoder_block(x, p, prefix, approximate=True):
    """Returns (output, attention probabilities [B, heads, N, N])."""

    def g(name):
        return p[prefix + name].astype(np.float64)

    y = layer_norm(x, g("LayerNorm_0/scale"), g("LayerNorm_0/bias"))
    a = "MultiHeadDotProductAttention_1/"
    q = np.einsum("bnd,dhk->bnhk", y, g(a + "query/kernel")) + g(a + "query/bias")
    k = np.einsum("bnd,dhk->bnhk", y, g(a + "key/kernel")) + g(a + "key/bias")
    v = np.einsum("bnd,dhk->bnhk", y, g(a + "value/kernel")) + g(a + "value/bias")
    logits = np.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    if prefix + a + "rel_embedding" in p:
        logits = logits + relative_bias(q, g(a + "rel_embedding"),
                                        p.get(prefix + a + "rel_embedding_cls"))
    probs = softmax(logits)
    ctx = np.einsum("bhqs,bshk->bqhk", probs, v)
    x = x + np.einsum("bqhk,hkd->bqd", ctx, g(a + "out/kernel")) + g(a + "out/bias")
    y = layer_norm(x, g("LayerNorm_2/scale"), g("LayerNorm_2/bias"))
    y = gelu(y @ g("MlpBlock_3/Dense_0/kernel") + g("MlpBlock_3/Dense_0/bias"), approximate)
    y = y @ g("MlpBlock_3/Dense_1/kernel") + g("MlpBlock_3/Dense_1/bias")
    return x + y, probs


def linear_resize(table, new):
    """`table` [old, ...] resized to `new` rows, linearly, end points aligned."""
    old = len(table)
    if new == old:
        return table
    coords = np.arange(new) * ((old - 1) / (new - 1) if new > 1 else 0.0)
    low = np.floor(coords).astype(int)
    high = np.minimum(low + 1, old - 1)
    frac = (coords - low).reshape(-1, *([1] * (table.ndim - 1)))
    return table[low] * (1 - frac) + table[high] * frac


def relative_bias(q, table, cls_table):
    """The paper's 1-D relative attention (appendix D.4), pair by pair: query i and key j get
    q_i . r / sqrt(k), with r the table's entry for the patches' offset i - j, or the class
    token's entry for a pair with the class token (Shaw et al., 2018)."""
    batch, length, heads, head_dim = q.shape
    prefix = 0 if cls_table is None else 1
    patches = length - prefix
    table = linear_resize(np.asarray(table, np.float64), 2 * patches - 1)
    bias = np.zeros((batch, heads, length, length))
    for i in range(length):
        for j in range(length):
            if i < prefix or j < prefix:
                r = np.asarray(cls_table, np.float64)[0]
            else:
                r = table[(i - prefix) - (j - prefix) + patches - 1]
            bias[:, :, i, j] = np.einsum("bhk,hk->bh", q[:, i], r)
    return bias / math.sqrt(head_dim)


def forward(p, images, classifier="token", approximate=True, include_top=True):
    """Returns (output, tokens after encoder_norm, list of attention probabilities)."""
    p64 = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(images, np.float64)
    if "conv_root/kernel" in p:  # hybrid: patches of the ResNet feature map
        x = resnet_forward(p, x)
    x = patchify(x, p64["embedding/kernel"], p64["embedding/bias"])
    if classifier == "token":
        cls = np.broadcast_to(p64["cls"], (x.shape[0], 1, x.shape[-1]))
        x = np.concatenate([cls, x], axis=1)
    if "Transformer/posembed_input/pos_embedding" in p64:  # relative: none to add
        x = x + p64["Transformer/posembed_input/pos_embedding"]
    n_blocks = len({k.split("/")[1] for k in p if k.startswith("Transformer/encoderblock_")})
    attentions = []
    for i in range(n_blocks):
        x, probs = encoder_block(x, p, f"Transformer/encoderblock_{i}/", approximate)
        attentions.append(probs)
    tokens = layer_norm(
        x, p64["Transformer/encoder_norm/scale"], p64["Transformer/encoder_norm/bias"]
    )
    out = tokens[:, 0] if classifier == "token" else tokens.mean(axis=1)
    if "pre_logits/kernel" in p:
        out = np.tanh(out @ p64["pre_logits/kernel"] + p64["pre_logits/bias"])
    if include_top and "head/kernel" in p:
        out = out @ p64["head/kernel"] + p64["head/bias"]
    return out, tokens, attentions


# ------------------------------------------------------------------------------------------
# The hybrids' ResNet (vit_jax models_resnet.py), in NumPy.


def _same_pads(size, kernel, stride):
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, (total // 2, total - total // 2)


def conv_same(x, w, stride=1):
    """TF/Flax SAME convolution, x [B, H, W, C], w [kh, kw, C, F]."""
    kh, kw = w.shape[:2]
    oh, ph = _same_pads(x.shape[1], kh, stride)
    ow, pw = _same_pads(x.shape[2], kw, stride)
    xp = np.pad(x, ((0, 0), ph, pw, (0, 0)))
    out = 0
    for i in range(kh):
        for j in range(kw):
            window = xp[
                :, i : i + (oh - 1) * stride + 1 : stride, j : j + (ow - 1) * stride + 1 : stride
            ]
            out = out + window @ w[i, j]
    return out


def max_pool_same(x, size=3, stride=2):
    oh, ph = _same_pads(x.shape[1], size, stride)
    ow, pw = _same_pads(x.shape[2], size, stride)
    xp = np.pad(x, ((0, 0), ph, pw, (0, 0)), constant_values=-np.inf)
    out = np.full((x.shape[0], oh, ow, x.shape[3]), -np.inf)
    for i in range(size):
        for j in range(size):
            out = np.maximum(
                out,
                xp[
                    :,
                    i : i + (oh - 1) * stride + 1 : stride,
                    j : j + (ow - 1) * stride + 1 : stride,
                ],
            )
    return out


def standardize(w, eps=1e-5):
    mean = w.mean(axis=(0, 1, 2), keepdims=True)
    std = w.std(axis=(0, 1, 2), keepdims=True)
    return (w - mean) / (std + eps)


def group_norm(x, scale, bias, groups=32, eps=1e-6):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(b, h, w, c) * scale.reshape(-1) + bias.reshape(-1)


def resnet_forward(p, x):
    """Root block and every `block{s}/unit{u}` found in `p` (float64)."""

    def g(key):
        return np.asarray(p[key], np.float64)

    def conv(key, y, stride=1):
        return conv_same(y, standardize(g(key + "/kernel")), stride)

    def gn(key, y):
        return group_norm(y, g(key + "/scale"), g(key + "/bias"))

    x = np.maximum(gn("gn_root", conv("conv_root", x, 2)), 0)
    x = max_pool_same(x)
    stages = sorted({int(k.split("/")[0][5:]) for k in p if k.startswith("block")})
    for s in stages:
        units = sorted({int(k.split("/")[1][4:]) for k in p if k.startswith(f"block{s}/")})
        for u in units:
            pre = f"block{s}/unit{u}/"
            stride = 2 if s > 1 and u == 1 else 1
            residual = x
            if pre + "conv_proj/kernel" in p:
                residual = gn(pre + "gn_proj", conv(pre + "conv_proj", x, stride))
            y = np.maximum(gn(pre + "gn1", conv(pre + "conv1", x)), 0)
            y = np.maximum(gn(pre + "gn2", conv(pre + "conv2", y, stride)), 0)
            y = gn(pre + "gn3", conv(pre + "conv3", y))
            x = np.maximum(residual + y, 0)
    return x


def resnet_params(rng, num_layers, width=64, scale=0.2):
    """Random hybrid ResNet parameters in the official layout."""

    def r(*shape, s=scale):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    p = {
        "conv_root/kernel": r(7, 7, 3, width, s=1.0),
        "gn_root/scale": 1 + r(width),
        "gn_root/bias": r(width),
    }
    channels = width
    for s, count in enumerate(num_layers, 1):
        f = width * 2 ** (s - 1)
        for u in range(1, count + 1):
            pre = f"block{s}/unit{u}/"
            if u == 1:
                p[pre + "conv_proj/kernel"] = r(1, 1, channels, 4 * f, s=1.0)
                p[pre + "gn_proj/scale"], p[pre + "gn_proj/bias"] = 1 + r(4 * f), r(4 * f)
            p[pre + "conv1/kernel"] = r(1, 1, channels if u == 1 else 4 * f, f, s=1.0)
            p[pre + "conv2/kernel"] = r(3, 3, f, f, s=1.0)
            p[pre + "conv3/kernel"] = r(1, 1, f, 4 * f, s=1.0)
            for i, n in (("1", f), ("2", f), ("3", 4 * f)):
                p[pre + f"gn{i}/scale"], p[pre + f"gn{i}/bias"] = 1 + r(n), r(n)
            channels = 4 * f
    return p, channels
