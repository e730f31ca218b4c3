"""Masked patch prediction on the embedded digits: pre-train without labels, then fine-tune with
k labels per class, against the same model trained from random initialisation.

    python examples/masked_patch_digits.py   # the README table, in 10-15 minutes on 2 CPU cores

The paper's self-supervision experiment (section 4.6, appendix B.1.2) in miniature, on the
digits demo's data and model (`train_digits.py`: scikit-learn's 8x8 digits as RGB, resized to
16x16, 4x4 patches, `DIGITS_CONFIG`, its light augmentation; the same 360 held-out digits).
For each seed (0, 1, 2):

1. pre-train the ViT encoder by masked patch prediction on the 1,437 training images without
   their labels (`keras_vit.pretraining.masked_patch_model` with the paper's target, the
   3-bit mean colour: on grey digits, 8 grey levels; `keras_vit.training.fit` with the
   "pretrain_mpp" recipe: Adam, warm-up, cosine decay; 50 epochs of batch 128, 550 updates,
   peak learning rate 3e-3 instead of the paper's 2e-4 for a run 2,000 times shorter);
2. for k in 1, 5, 10, 25: draw k labelled training images per class
   (`keras_vit.evaluation.sample_shots`, seeded), and fine-tune with the paper's fine-tuning
   recipe (SGD momentum 0.9, clipping at 1, warm-up, cosine decay; 100 updates of batch 64
   augmented views of the k x 10 images, learning rate 0.1) both the pre-trained encoder
   with a new zero head and the same architecture from random initialisation (the same
   seed, steps, batches and learning rate);
3. measure both on the held-out digits.

It prints held-out accuracy, mean and standard deviation over the seeds, as a Markdown table.
Every run is seeded and TensorFlow runs with deterministic ops. The learning rates and lengths
were chosen on a validation split of the training images (`--validate`, one seed: fine-tuning
0.01, 0.03 and 0.1 for both initialisations, pre-training 1e-3 and 3e-3 by the masked
accuracy), and to fit the time, never on the held-out digits.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_digits  # noqa: E402  (the demo's data, split, model and augmentation)

SHOTS = (1, 5, 10, 25)
FINETUNE_BATCH = 64
EPOCH_EXAMPLES = 10 * FINETUNE_BATCH  # fine-tuning epochs of at least 10 steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (3)")
    parser.add_argument("--shots", default=",".join(map(str, SHOTS)),
                        help="labelled images per class, comma-separated (1,5,10,25)")
    parser.add_argument("--pretrain-epochs", type=int, default=50)
    parser.add_argument("--pretrain-lr", type=float, default=3e-3)
    parser.add_argument("--finetune-steps", type=int, default=100)
    parser.add_argument("--finetune-lr", type=float, default=0.1)
    parser.add_argument("--objective", default="mean_color",
                        help="mean_color, downsized_color or pixels")
    parser.add_argument("--validate", action="store_true",
                        help="tune: hold out 20%% of the training images and report on them")
    parser.add_argument("--output", default=os.path.join("runs", "masked_patch_digits"),
                        help="the pre-training runs' folder (one per seed)")
    args = parser.parse_args(argv)
    shots = [int(k) for k in args.shots.split(",")]

    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit import data, evaluation, pretraining, training

    start = time.perf_counter()
    tf.config.experimental.enable_op_determinism()
    images, labels = train_digits.digits_rgb()
    x_train, x_test, y_train, y_test = train_digits.split(images, labels)
    if args.validate:
        x_train, x_test, y_train, y_test = train_digits.split(x_train, y_train)
    config = train_digits.DIGITS_CONFIG
    size = config["image_size"]
    test = data.from_arrays(x_test, y_test, num_classes=10, image_size=size, batch_size=256,
                            training=False)

    def pretrain(seed):
        """The encoder pre-trained on the training images, without labels: its .npz."""
        keras.utils.set_random_seed(seed)
        vit = keras_vit.ViT(**dict(config, include_top=False), name="vit_digits")
        model = pretraining.masked_patch_model(vit, objective=args.objective, seed=seed)
        unlabelled = data.from_arrays(x_train, None, image_size=size, batch_size=128,
                                      training=True, seed=seed, augment=train_digits.AUGMENT)
        summary = training.fit(model, unlabelled, output_dir=os.path.join(args.output,
                                                                          f"seed{seed}"),
                               epochs=args.pretrain_epochs, recipe="pretrain_mpp",
                               learning_rate=args.pretrain_lr, verbose=0, overwrite=True,
                               backup_every=args.pretrain_epochs)
        print(f"seed {seed}: pre-trained {summary['updates']} updates in "
              f"{summary['seconds']:.0f} s", flush=True)
        return summary["encoder_weights"]

    def finetune(seed, k, encoder):
        """Held-out accuracy after fine-tuning on k labelled images per class."""
        keras.utils.set_random_seed(seed)
        model = keras_vit.ViT(**config, name="vit_digits")
        if encoder:
            keras_vit.load_pretrained(model, encoder)  # a fresh zero head, as the paper
        picks = evaluation.sample_shots(y_train, k, seed=seed)
        # Copies of the k x 10 images, so that every step is a batch of FINETUNE_BATCH
        # augmented views whatever k is.
        picks = np.tile(picks, -(-EPOCH_EXAMPLES // len(picks)))
        labelled = data.from_arrays(x_train[picks], y_train[picks], num_classes=10,
                                    image_size=size, batch_size=FINETUNE_BATCH, training=True,
                                    seed=seed, augment=train_digits.AUGMENT)
        with tempfile.TemporaryDirectory() as run_dir:
            training.fit(model, labelled, output_dir=run_dir, steps=args.finetune_steps,
                         recipe="finetune", learning_rate=args.finetune_lr, verbose=0,
                         backup_every=10**6)
        logits = model.predict(test.dataset, verbose=0)
        return float(np.mean(np.argmax(logits, -1) == y_test))

    results = {(k, init): [] for k in shots for init in ("scratch", "mpp")}
    for seed in range(args.seeds):
        encoder = pretrain(seed)
        for k in shots:
            for init, weights in (("scratch", None), ("mpp", encoder)):
                results[k, init].append(finetune(seed, k, weights))
            print(f"seed {seed}, {k}-shot: scratch {results[k, 'scratch'][-1]:.2%}, "
                  f"masked-patch pre-trained {results[k, 'mpp'][-1]:.2%}", flush=True)

    split_name = "validation" if args.validate else "held-out"
    print(f"\n{split_name} accuracy ({len(y_test)} digits), mean ± std over {args.seeds} "
          f"seeds, in {time.perf_counter() - start:.0f} s:\n")
    print("| labels per class | from scratch | masked-patch pre-trained |")
    print("|---|---|---|")
    for k in shots:
        cells = [f"{100 * np.mean(results[k, init]):.1f}% ± {100 * np.std(results[k, init]):.1f}"
                 for init in ("scratch", "mpp")]
        print(f"| {k} | {cells[0]} | {cells[1]} |")
    return results


if __name__ == "__main__":
    main()
