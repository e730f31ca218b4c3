"""Where one AdamW training step goes: the gradient (forward + backward) and the update apart,
for keras_vit (TensorFlow + XLA) and timm (eager PyTorch), ViT-B/16, batch 8, 224 px.

    python -m benchmarks.step_breakdown keras_vit
    .venv-bench/bin/python -m benchmarks.step_breakdown timm

Three timings, each the median of `--steps` calls after two untimed ones, `--rounds` times in
turn: "gradient" (forward, cross-entropy, backward: every parameter's gradient, no update),
"update" (AdamW applied to those gradients alone) and "step" (the two together, as `fit`
and the peer table run them: keras_vit's `training.compile_model` + `train_on_batch`,
timm's zero_grad / forward / backward / `optimizer.step()`). With one block's forward +
backward from `benchmarks.block_profile`, "gradient" splits into the 12 blocks and the rest
(patch embedding, head, loss); `--depth 1` against the full depth measures a block inside the
whole model instead:

    python -m benchmarks.step_breakdown keras_vit --depth 1
"""

import argparse
import statistics

import numpy as np

from benchmarks.contenders.common import LEARNING_RATE, WEIGHT_DECAY, median_seconds

BATCH, CLASSES = 8, 1000


def keras_vit_steps(variant, depth=None):
    import keras
    import tensorflow as tf

    import keras_vit
    from keras_vit import training

    keras.utils.set_random_seed(0)
    extra = {} if depth is None else {"num_layers": depth}
    model = keras_vit.create_model(variant, num_classes=CLASSES, dropout_rate=0.0, **extra)
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(-1, 1, (BATCH, 224, 224, 3)).astype("float32"))
    labels = tf.constant(rng.integers(0, CLASSES, BATCH))
    optimizer = training.AdamW(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    training.compile_model(model, optimizer, jit_compile=True)
    variables = model.trainable_variables
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=True)
    def gradient():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        return tape.gradient(loss, variables)

    grads = gradient()

    @tf.function(jit_compile=True)
    def update():
        optimizer.apply(grads, variables)

    return {
        "gradient": lambda: [g.numpy() for g in gradient()[:1]],
        "update": lambda: update() or variables[0].numpy(),
        "step": lambda: model.train_on_batch(images, labels),
    }


def timm_steps(variant, depth=None):
    import torch
    import torch.nn.functional as F

    from benchmarks.contenders import common, timm_vit

    timm_vit.import_timm()
    from timm.models.vision_transformer import VisionTransformer

    config = common.variant_config(variant)
    torch.manual_seed(0)
    model = VisionTransformer(img_size=224, patch_size=config["patch_size"],
                              embed_dim=config["hidden_size"],
                              depth=config["num_layers"] if depth is None else depth,
                              num_heads=config["num_heads"],
                              mlp_ratio=config["mlp_dim"] / config["hidden_size"],
                              num_classes=CLASSES).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=WEIGHT_DECAY)
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.uniform(-1, 1, (BATCH, 3, 224, 224)).astype("float32"))
    labels = torch.from_numpy(rng.integers(0, CLASSES, BATCH))

    def gradient():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()

    def step():
        gradient()
        optimizer.step()

    gradient()
    return {"gradient": gradient, "update": optimizer.step, "step": step}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=("keras_vit", "timm"))
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--depth", type=int, default=None,
                        help="encoder blocks instead of the variant's (e.g. 1 and 12: the "
                             "difference over 11 is one block's cost inside the whole model)")
    args = parser.parse_args(argv)
    steps = keras_vit_steps if args.framework == "keras_vit" else timm_steps
    parts = steps(args.variant, args.depth)
    results = {name: [] for name in parts}
    for _ in range(args.rounds):
        for name, fn in parts.items():
            results[name].append(median_seconds(fn, args.steps, warmup=2))
    depth = "" if args.depth is None else f" with {args.depth} blocks"
    print(f"{args.framework}: ViT-{args.variant}{depth} training step, batch {BATCH}, "
          f"{args.rounds} rounds of {args.steps} calls\n")
    print("| part | median | per round |\n|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.2f} s | "
              f"{', '.join(f'{v:.2f}' for v in values)} s |", flush=True)


if __name__ == "__main__":
    main()
