"""What TF Serving and its clients do, written independently of keras_vit.export for its tests.

- `parse_rest_request` / `rest_response`: TF Serving's REST predict API (JSON <-> tensors, the
  `{"b64": ...}` convention for binary strings, row and columnar formats), following
  tensorflow_serving/util/json_tensor.cc and the REST API documentation.
- `PredictionService`: a gRPC `PredictionService.Predict` backed by a loaded SavedModel, so the
  client example runs against the real stub, protos and transport.
- `decode_image` / `resize_bilinear`: the client-side view of an image (PIL's decoder, and
  `tf.image.resize`'s bilinear resize with half-pixel centres written in NumPy).
- The serving commands of README and the serving guide, which the tests run.
"""

import base64
import io
import json

import numpy as np
from PIL import Image

# The documented REST request (README, docs/guides/serving.md): a JSON body with the base64
# image, written to a file for curl.
REST_REQUEST_COMMAND = (
    """printf '{"instances": [{"b64": "%s"}]}' "$(base64 -w0 cat.jpg)" > request.json"""
)
REST_CURL_COMMAND = "curl -s -d @request.json http://localhost:8501/v1/models/vit:predict"

# The serving guide's gRPC client (docs/guides/serving.md), verbatim.
GRPC_CLIENT_EXAMPLE = '''\
import grpc
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

request = predict_pb2.PredictRequest()
request.model_spec.name = "vit"
request.model_spec.signature_name = "serving_default"
with open("cat.jpg", "rb") as f:
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([f.read()]))

with grpc.insecure_channel("localhost:8500") as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(request, timeout=30.0)

labels = tf.make_ndarray(response.outputs["top_k_labels"])[0]
scores = tf.make_ndarray(response.outputs["top_k_scores"])[0]
for label, score in zip(labels, scores):
    print(f"{label.decode()}: {score:.4f}")
'''

# --------------------------------------------------------------------------------------------
# REST.


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"}


def _from_json(value):
    """JSON value to nested lists, with `{"b64": s}` objects decoded to bytes."""
    if _is_b64(value):
        return base64.b64decode(value["b64"], validate=True)
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def parse_rest_request(body, input_dtypes):
    """Parses a REST predict body into `(signature_name, {input name: ndarray})`.

    Args:
        body: str, the JSON request.
        input_dtypes: dict of the signature's input names to NumPy dtypes (object for strings).
    """
    request = json.loads(body)
    signature = request.get("signature_name", "serving_default")
    if ("instances" in request) == ("inputs" in request):
        raise ValueError("a request has exactly one of 'instances' and 'inputs'")
    names = list(input_dtypes)
    if "instances" in request:
        rows = []
        for instance in request["instances"]:
            named = isinstance(instance, dict) and not _is_b64(instance)
            if not named and len(names) != 1:
                raise ValueError("instances of a multi-input signature must be JSON objects")
            rows.append(instance if named else {names[0]: instance})
        columns = {name: [row[name] for row in rows] for name in names}
    else:
        inputs = request["inputs"]
        named = isinstance(inputs, dict) and not _is_b64(inputs)
        columns = inputs if named else {names[0]: inputs}
    return signature, {
        name: np.array(_from_json(columns[name]), dtype=dtype)
        for name, dtype in input_dtypes.items()
    }


def _to_json(name, value):
    if isinstance(value, bytes):
        # TF Serving returns string outputs as text, or base64 if the name ends with "_bytes".
        return {"b64": base64.b64encode(value).decode()} if name.endswith("_bytes") else (
            value.decode("utf-8"))
    return value.item() if isinstance(value, np.generic) else value


def rest_response(outputs):
    """The row-format REST response (`{"predictions": [...]}`) for a dict of batched outputs."""
    batch = len(next(iter(outputs.values())))
    predictions = []
    for i in range(batch):
        row = {}
        for name, value in outputs.items():
            row[name] = np.vectorize(lambda v, n=name: _to_json(n, v), otypes=[object])(
                value[i]).tolist()
        predictions.append(row)
    return json.dumps({"predictions": predictions})


# --------------------------------------------------------------------------------------------
# gRPC.


def prediction_service(loaded):
    """A `PredictionServiceServicer` that answers Predict with the SavedModel `loaded`."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):
            signature = loaded.signatures[request.model_spec.signature_name or "serving_default"]
            inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
            try:
                outputs = signature(**inputs)
            except tf.errors.InvalidArgumentError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)
            response = predict_pb2.PredictResponse()
            response.model_spec.CopyFrom(request.model_spec)
            for name, value in outputs.items():
                response.outputs[name].CopyFrom(tf.make_tensor_proto(value.numpy()))
            return response

    return PredictionService()


def start_grpc_server(servicer):
    """Serves `servicer` on a free local port; returns `(server, "localhost:PORT")`."""
    from concurrent import futures

    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("localhost:0")
    server.start()
    return server, f"localhost:{port}"


# --------------------------------------------------------------------------------------------
# Images.


# PIL's save options: JPEG at quality 90; lossless WebP, so that the comparison with PIL's own
# decoding does not depend on two libwebp builds decoding lossy data alike.
ENCODE_OPTIONS = {"JPEG": {"quality": 90}, "WEBP": {"lossless": True}}


def encode(image, fmt):
    """Encodes a uint8 RGB array as "JPEG", "PNG", "GIF", "BMP" or "WEBP" bytes with PIL."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=fmt, **ENCODE_OPTIONS.get(fmt, {}))
    return buffer.getvalue()


def decode_image(data):
    """RGB uint8 pixels of an encoded image, decoded by PIL (libjpeg's default exact DCT)."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def resize_bilinear(image, height, width):
    """Bilinear resize with half-pixel centres and clamped edges (`tf.image.resize`), float64."""
    image = np.asarray(image, np.float64)

    def taps(size_out, size_in):
        # Output pixel o samples input coordinate (o + 0.5) * in / out - 0.5.
        coords = np.clip((np.arange(size_out) + 0.5) * size_in / size_out - 0.5, 0, size_in - 1)
        low = np.floor(coords).astype(int)
        return low, np.minimum(low + 1, size_in - 1), coords - low

    y0, y1, fy = taps(height, image.shape[0])
    x0, x1, fx = taps(width, image.shape[1])
    fx = fx[None, :, None]
    top = image[y0][:, x0] * (1 - fx) + image[y0][:, x1] * fx
    bottom = image[y1][:, x0] * (1 - fx) + image[y1][:, x1] * fx
    return top * (1 - fy[:, None, None]) + bottom * fy[:, None, None]


def sample_images(rng, sizes):
    """Smooth random colour images with noise, one per (height, width) in `sizes`."""
    images = []
    for h, w in sizes:
        y, x = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
        a, b, c = rng.uniform(40, 255, 3)
        image = np.stack([a * x, b * y, c * (1 - x * y)], -1) + rng.normal(0, 12, (h, w, 3))
        images.append(np.clip(image, 0, 255).astype(np.uint8))
    return images
