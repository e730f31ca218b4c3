"""Loads an export in a process where Keras and keras_vit cannot be imported, and calls it.

Usage: python export_fresh_process.py EXPORT_DIR INPUTS.npz OUTPUTS.npz

INPUTS.npz holds `images_<i>` (float32 [B, H, W, 3]) and `bytes_<i>` (encoded images, as an
object array) for several batches i. OUTPUTS.npz receives, for each signature and batch, every
output as `<signature>_<i>_<output>`, plus `invalid_error` (the message of a request with bytes
that are not an image) and `after_error_<output>` (a valid request made after that one).
"""

import sys

import numpy as np


def main(export_dir, inputs_path, outputs_path):
    # Any attempt to import these raises ImportError: the export must stand on TensorFlow alone.
    for name in ("keras", "keras_vit", "tf_keras"):
        sys.modules[name] = None
    import tensorflow as tf

    loaded = tf.saved_model.load(export_dir)
    inputs = np.load(inputs_path, allow_pickle=True)
    batches = sorted(int(k.split("_")[1]) for k in inputs.files if k.startswith("images_"))
    results = {}
    for i in batches:
        calls = {
            "predict_images": {"images": tf.constant(inputs[f"images_{i}"])},
            "serving_default": {"image_bytes": tf.constant(list(inputs[f"bytes_{i}"]))},
        }
        for signature, kwargs in calls.items():
            for name, value in loaded.signatures[signature](**kwargs).items():
                results[f"{signature}_{i}_{name}"] = value.numpy()
    serve = loaded.signatures["serving_default"]
    good = tf.constant(list(inputs[f"bytes_{batches[0]}"]))
    try:
        serve(image_bytes=tf.constant([good[0].numpy(), b"this is not an image"]))
        results["invalid_error"] = np.array("no error")
    except tf.errors.InvalidArgumentError as e:
        results["invalid_error"] = np.array(e.message)
    for name, value in serve(image_bytes=good).items():
        results[f"after_error_{name}"] = value.numpy()
    results["imported_keras"] = np.array(
        [name for name in ("keras", "keras_vit") if sys.modules.get(name) is not None]
    )
    np.savez(outputs_path, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
