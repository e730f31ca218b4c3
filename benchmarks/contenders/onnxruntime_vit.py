"""Contender: the keras_vit contender's model exported to ONNX (`keras_vit.export_onnx`) and run
as a user serves it: an `onnxruntime.InferenceSession` on the CPU with ONNX Runtime's defaults.
Inference only, fp32 only; the export counts in the build time.
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

    model = keras_vit_model.build_model(config["name"], args.image_size, args.seed)
    with tempfile.TemporaryDirectory() as folder:
        path = keras_vit.export_onnx(model, os.path.join(folder, "vit.onnx"))
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    images = common.batch_for(args)[0]  # [B, H, W, 3] in [-1, 1]
    return lambda: session.run(None, {onnx_export.INPUT_NAME: images})[0]


def build_training(args, config):
    raise ValueError("The onnxruntime contender measures inference only (an ONNX file holds "
                     "no training step).")


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
