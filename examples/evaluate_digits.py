"""Evaluates the shipped digits demo the paper's two ways, on the demo's held-out split.

    python examples/evaluate_digits.py [--out runs/digits_eval]

1. Accuracy of the classifier (`keras_vit.evaluate`): top-1, top-5, loss, a confusion matrix
   PNG and per-class accuracy CSV in --out.
2. Few-shot linear accuracy (`keras_vit.evaluation.fewshot_table`): frozen features of k
   training images per class (k = 1, 5, 10, 25), a closed-form regularised least-squares fit
   onto {-1, 1}^10 targets, accuracy on the 360 held-out images; printed as a Markdown table.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_digits  # noqa: E402  (the demo's data: scikit-learn digits and its split)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("runs", "digits_eval"))
    parser.add_argument("--checkpoint", default="digits",
                        help="registry name or .npz of a model with the demo's configuration")
    args = parser.parse_args(argv)

    import keras_vit
    from keras_vit import data, evaluation

    model = keras_vit.from_pretrained(args.checkpoint)
    size = int(model.input.shape[1])  # the demo's images are square
    images, labels = train_digits.digits_rgb()
    x_train, x_test, y_train, y_test = train_digits.split(images, labels)

    def pipeline(x, y):  # the demo's evaluation preprocessing: resize 8 -> 16, to [-1, 1]
        return data.from_arrays(x, y, num_classes=10, image_size=size, batch_size=120,
                                training=False).dataset

    report = keras_vit.evaluate(model, pipeline(x_test, y_test), out_dir=args.out,
                                class_names=[str(i) for i in range(10)], progress=False)
    print(f"held-out: {report['num_examples']} images, top-1 {report['top1']:.2%}, "
          f"top-5 {report['top5']:.2%}, loss {report['loss']:.4f}")
    for path in report["files"]:
        print(f"wrote {path}")
    train = evaluation.extract_features(model, pipeline(x_train, y_train), progress=False)
    test = evaluation.extract_features(model, pipeline(x_test, y_test), progress=False)
    table = evaluation.fewshot_table(*train, *test)
    print("\nFew-shot linear accuracy on the held-out digits (frozen features):\n")
    print(evaluation.format_fewshot_table(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
