"""TF Serving's warm-up requests for a SavedModel: PredictionLog records that the server
replays when it loads the model (`assets.extra/tf_serving_warmup_requests`), so that the first
real request does not pay for graph initialisation. They need tensorflow-serving-api (the
`serving` extra)."""

import os

import numpy as np
import tensorflow as tf

# TF Serving replays the records of this file, in the SavedModel's `assets.extra/`, at load time.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# Batch sizes of the warm-up requests, for each signature.
WARMUP_BATCH_SIZES = (1, 2)


def warmup_images(height, width, count, seed=0):
    """`count` deterministic RGB uint8 test images `[count, height, width, 3]`: smooth colour
    gradients with noise, so that JPEG encoding keeps them recognisable."""
    rng = np.random.default_rng(seed)
    y, x = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    images = []
    for _ in range(count):
        a, b, c = rng.uniform(0, 255, 3)
        image = np.stack([a * x, b * y, c * (1 - x * y)], axis=-1)
        image += rng.normal(0, 8, image.shape)
        images.append(np.clip(image, 0, 255).astype(np.uint8))
    return np.stack(images)


def _encode(image, index):
    """Encodes a uint8 image, alternating JPEG and PNG so that both decoders warm up."""
    return (tf.io.encode_jpeg if index % 2 == 0 else tf.io.encode_png)(image).numpy()


def requests(model_name, height, width, signatures):
    """PredictionLog records: for each signature and each of `WARMUP_BATCH_SIZES`, one request
    of images `height` x `width`. `signatures`: `(name, input name, dtype)` triples, a dtype
    for arrays of pixels, None for encoded images."""
    predict_pb2, prediction_log_pb2 = _protos()
    records = []
    for batch in WARMUP_BATCH_SIZES:
        images = warmup_images(height, width, batch, seed=batch)
        for signature, name, dtype in signatures:
            value = ([_encode(im, i) for i, im in enumerate(images)] if dtype is None
                     else images.astype(dtype))
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            records.append(log.SerializeToString())
    return records


def _protos():
    try:
        # optional: the `serving` extra
        from tensorflow_serving.apis import predict_pb2, prediction_log_pb2
    except ImportError as e:
        raise ImportError(
            "Writing TF Serving warm-up requests needs tensorflow-serving-api: "
            "pip install 'tensorflow-serving-api>=2.21,<2.22' (or export with warmup=False)."
        ) from e
    return predict_pb2, prediction_log_pb2


def protos_available():
    """Whether tensorflow-serving-api is installed (warm-up requests can be written)."""
    try:
        _protos()
    except ImportError:
        return False
    return True


def write(path, records):
    """Writes the PredictionLog `records` to the TFRecord file `path`."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
