"""ViT-B/16 inference through TFLite, batch 8, 2 threads: float32, dynamic-range int8, and
static (full-integer) int8.

    python -m benchmarks.tflite_speed [--no-static]

Converts with `keras_vit.export.export_tflite` (a random head, as the peer benchmark uses),
times the interpreter (median of 4 after one call) and reports top-1 agreement with float32.
The static int8 file is converted here, not by the package (on this project's AVX2 machine it
is slower than float32, so `export_tflite` does not offer it): `Optimize.DEFAULT` with a
representative dataset of 16 random images, float input and output, the other operations
int8 where TFLite has an int8 kernel (about 3 minutes, mostly calibration).
"""

import os
import sys
import tempfile
import time

import numpy as np


def _static_int8(model, path, calibration):
    """Full-integer quantisation calibrated on `calibration` [N, H, W, 3] in [0, 255]."""
    import tensorflow as tf

    from keras_vit import export

    with export.tflite_converter(model) as converter:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: (
            {export.IMAGES_INPUT: image[None]} for image in calibration)
        data = converter.convert()
    with open(path, "wb") as f:
        f.write(data)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    import tensorflow as tf

    import keras_vit
    from keras_vit import export

    model = keras_vit.create_model("B/16")
    rng = np.random.default_rng(0)
    for weight in model.get_layer("head").weights:  # a random head, as the benchmark does
        weight.assign(rng.normal(0, 0.02, weight.shape).astype("float32"))
    x = rng.uniform(0, 255, (8, 224, 224, 3)).astype("float32")
    routes = [None, "dynamic-int8"] + ([] if "--no-static" in argv else ["static-int8"])
    reference = None
    for route in routes:
        path = os.path.join(tempfile.mkdtemp(), "m.tflite")
        start = time.perf_counter()
        if route == "static-int8":
            _static_int8(model, path, rng.uniform(0, 255, (16, 224, 224, 3)).astype("float32"))
        else:
            export.export_tflite(model, path, quantize=route)
        convert = time.perf_counter() - start
        runner = tf.lite.Interpreter(model_path=path, num_threads=2).get_signature_runner()
        name = list(runner.get_input_details())[0]
        out = list(runner(**{name: x}).values())[0]
        times = []
        for _ in range(4):
            start = time.perf_counter()
            runner(**{name: x})
            times.append(time.perf_counter() - start)
        reference = out if reference is None else reference
        agree = np.mean(out.argmax(1) == reference.argmax(1))
        print(f"{route or 'float32'}: convert {convert:.0f}s, {8 / np.median(times):.2f} img/s, "
              f"size {os.path.getsize(path) / 2**20:.0f} MiB, top-1 agreement with float32 "
              f"{agree:.0%}")


if __name__ == "__main__":
    main()
