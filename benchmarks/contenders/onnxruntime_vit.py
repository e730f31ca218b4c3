"""Contender: keras_vit exported to ONNX (`keras_vit.export_onnx`), run by ONNX Runtime on the
CPU. Inference only, fp32 only.

    python -m benchmarks.contenders.onnxruntime_vit --mode infer --model B/16

The model is the keras_vit contender's (`keras_vit_model.build_model`: the variant with random
weights and a random head), exported through Keras' own ONNX export, then loaded as a user
serves it: `onnxruntime.InferenceSession` with the CPU execution provider and ONNX Runtime's
default options (all graph optimisations, its own thread count). A step is `session.run` on
one batch of preprocessed images, which returns NumPy. The export is part of the build time,
as the SavedModel's is for `keras_vit-savedmodel`.
"""

import os
import sys
import tempfile

from benchmarks.contenders import common, keras_common, keras_vit_model

PRECISIONS = ("fp32",)


def setup(args):
    if args.device != "cpu" or args.backend != "tensorflow" or args.xla is not None:
        raise RuntimeError("The onnxruntime contender runs the ONNX file on the CPU, exported "
                           "on the TensorFlow backend. Expected --device cpu and no --xla, "
                           "--no-xla or --backend.")
    versions = keras_common.setup(args, "keras_vit")
    import onnxruntime
    import tf2onnx

    return dict(versions, onnxruntime=onnxruntime.__version__, tf2onnx=tf2onnx.__version__)


def build_inference(args, config):
    import onnxruntime

    import keras_vit
    from keras_vit import onnx_export

    model = keras_vit_model.build_model(args, config)
    with tempfile.TemporaryDirectory() as folder:
        path = keras_vit.export_onnx(model, os.path.join(folder, "vit.onnx"))
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    images = common.random_batch(args)[0]  # [B, H, W, 3] in [-1, 1]
    return lambda: session.run(None, {onnx_export.INPUT_NAME: images})[0]


def build_training(args, config):
    raise ValueError("The onnxruntime contender measures inference only (an ONNX file holds "
                     "no training step).")


def device_peak_bytes(args):
    return None  # the CPU only


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
