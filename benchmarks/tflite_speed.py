"""ViT-B/16 inference through TFLite (float32 and dynamic-range int8), batch 8, 2 threads.

    python -m benchmarks.tflite_speed

Converts with `keras_vit.export.export_tflite` (a random head, as the peer benchmark uses),
times the interpreter (median of 4 after one call) and reports top-1 agreement with float32.
"""
import os, time, tempfile
import numpy as np
import keras_vit
from keras_vit import export
model = keras_vit.create_model("B/16")
rng = np.random.default_rng(0)
for layer in model.get_layer("head").weights:  # a random head, as the benchmark does
    layer.assign(rng.normal(0, 0.02, layer.shape).astype("float32"))
x = rng.uniform(0, 255, (8, 224, 224, 3)).astype("float32")
ref = None
for quantize in (None, "dynamic-int8"):
    path = os.path.join(tempfile.mkdtemp(), "m.tflite")
    t = time.perf_counter(); export.export_tflite(model, path, quantize=quantize); conv = time.perf_counter() - t
    import tensorflow as tf
    interp = tf.lite.Interpreter(model_path=path, num_threads=2)
    runner = interp.get_signature_runner()
    name = list(runner.get_input_details())[0]
    out = runner(**{name: x}); out = list(out.values())[0]
    times = []
    for _ in range(4):
        t = time.perf_counter(); runner(**{name: x}); times.append(time.perf_counter() - t)
    if ref is None: ref = out
    agree = np.mean(out.argmax(1) == ref.argmax(1))
    print(f"{quantize or 'float32'}: convert {conv:.0f}s, {8/np.median(times):.2f} img/s, size {os.path.getsize(path)/2**20:.0f} MiB, top-1 agreement with float32 {agree:.0%}")
