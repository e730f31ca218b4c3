"""SavedModel and TFLite export, proven the ways TF Serving loads and calls a model.

No server runs here: the export is read by `saved_model_cli` (show, and run through the TF1
Session loader TF Serving uses), loaded by a fresh process that cannot import Keras, called
with REST and gRPC wire formats (tests/export_serving.py), and its warm-up file is replayed.
Every expectation comes from the Keras model on images decoded by PIL and resized in NumPy.
"""

import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import export_serving
import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import execution, export, tflite, weights

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48)
NUM_CLASSES = 10
CLASS_NAMES = ["tench", "goldfish", "great white shark", "tiger shark", "hammerhead",
               "electric ray", "stingray", "crème brûlée", "hen", "ostrich"]
TOP_K = 5
OUTPUTS = {"probabilities", "top_k_scores", "top_k_indices", "top_k_labels"}


def random_model(seed=0, **kwargs):
    """A tiny classifier with random official-layout weights (non-trivial logits)."""
    model = keras_vit.ViT(num_classes=NUM_CLASSES, **TINY, **kwargs)
    params = reference.official_params(
        np.random.default_rng(seed), hidden=32, mlp=48, heads=4, layers=2, patch=(8, 8),
        grid=(4, 4), num_classes=NUM_CLASSES,
    )
    weights.load_params(model, params)
    return model


def expected_outputs(model, images, class_names=CLASS_NAMES, top_k=TOP_K):
    """The four outputs, from the Keras logits of RGB `images` in [0, 255], in NumPy."""
    images = np.asarray(images, np.float32)
    logits = np.asarray(model.predict_on_batch(images / 127.5 - 1), np.float64)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    indices = np.argsort(-probabilities, axis=-1, kind="stable")[:, :top_k]
    return {
        "probabilities": probabilities,
        "top_k_scores": np.take_along_axis(probabilities, indices, -1),
        "top_k_indices": indices,
        "top_k_labels": np.array(class_names, object)[indices],
    }


def assert_outputs_match(got, expected, atol=1e-5):
    assert set(got) == OUTPUTS
    got = {k: np.asarray(v) for k, v in got.items()}
    assert got["probabilities"].dtype == np.float32
    assert got["top_k_scores"].dtype == np.float32
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=atol)
    np.testing.assert_allclose(got["top_k_scores"], expected["top_k_scores"], atol=atol)
    np.testing.assert_array_equal(got["top_k_indices"], expected["top_k_indices"])
    labels = np.vectorize(lambda s: s.decode() if isinstance(s, bytes) else s, otypes=[object])(
        got["top_k_labels"])
    np.testing.assert_array_equal(labels, expected["top_k_labels"])


def decoded_and_resized(encoded, height=32, width=32):
    """What the serving graph should feed the model: PIL's pixels, resized in NumPy."""
    return np.stack([
        export_serving.resize_bilinear(export_serving.decode_image(data), height, width)
        for data in encoded
    ])


class Tools:
    """Command-line tools run in the background on the shared export, while other tests run.

    Their output goes to files, so that a full pipe never stalls them.
    """

    def __init__(self, work):
        self.work = work
        self.processes = {}

    def start(self, name, *args):
        with open(self.work / f"{name}.out", "w") as out, open(self.work / f"{name}.err",
                                                                 "w") as err:
            self.processes[name] = subprocess.Popen(
                args, stdout=out, stderr=err, cwd=self.work,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))

    def output(self, name):
        code = self.processes[name].wait(timeout=300)
        assert code == 0, (self.work / f"{name}.err").read_text()[-3000:]
        return (self.work / f"{name}.out").read_text()

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One float32 export of a random tiny model, shared by the read-only tests.

    Starts `saved_model_cli show`, `saved_model_cli run` and the fresh TensorFlow-only process
    on it at once (each needs seconds to import TensorFlow); their tests, at the end of the
    file, collect the results.
    """
    model = random_model()
    work = tmp_path_factory.mktemp("export")
    path = export.export_saved_model(model, work / "vit", class_names=CLASS_NAMES, top_k=TOP_K)
    rng = np.random.default_rng(1)
    cli_images = rng.uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    np.save(work / "images.npy", cli_images)
    fresh_inputs = {}
    for i, sizes in enumerate([[(40, 48)], [(32, 32), (24, 30), (64, 20)]]):
        fresh_inputs[f"images_{i}"] = rng.uniform(0, 255, (len(sizes), 32, 32, 3)).astype(
            np.float32)
        fresh_inputs[f"bytes_{i}"] = np.array(
            [export_serving.encode(im, ("JPEG", "PNG")[j % 2])
             for j, im in enumerate(export_serving.sample_images(rng, sizes))], object)
    np.savez(work / "inputs.npz", **fresh_inputs)

    tools = Tools(work)
    saved_model_cli = os.path.join(BIN, "saved_model_cli")
    tools.start("show", saved_model_cli, "show", "--all", "--dir", path)
    tools.start("run", saved_model_cli, "run", "--dir", path, "--tag_set", "serve",
                "--signature_def", "predict_images", "--inputs", f"images={work}/images.npy",
                "--outdir", str(work / "cli_out"))
    tools.start("fresh", sys.executable, os.path.join(HERE, "export_fresh_process.py"), path,
                str(work / "inputs.npz"), str(work / "outputs.npz"))
    yield types.SimpleNamespace(model=model, path=path, work=work, tools=tools,
                                cli_images=cli_images, fresh_inputs=fresh_inputs)
    tools.stop()


@pytest.fixture(scope="module")
def loaded(exported):
    return tf.saved_model.load(exported.path)


def test_export_layout_stores_each_weight_once(exported):
    path = exported.path
    assert sorted(os.listdir(path)) == ["assets", "assets.extra", "fingerprint.pb",
                                        "saved_model.pb", "variables"]
    assert (pathlib.Path(path) / "assets" / "labels.txt").read_text(
        encoding="utf-8").splitlines() == CLASS_NAMES
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o777 & ~umask  # readable by a server's own user
    stored = sum(int(np.prod(shape)) for name, shape in tf.train.list_variables(
        os.path.join(path, "variables", "variables")) if name != "_CHECKPOINTABLE_OBJECT_GRAPH")
    assert stored == exported.model.count_params()  # not twice (keras-team/keras#23553)
    # What the export was made with, beside the warm-up records.
    assert sorted(os.listdir(pathlib.Path(path) / "assets.extra")) == [
        "keras_vit.json", "tf_serving_warmup_requests"]
    metadata = json.loads((pathlib.Path(path) / "assets.extra" / "keras_vit.json").read_text())
    assert metadata == dict(image_size=[32, 32], num_classes=NUM_CLASSES, top_k=TOP_K,
                            image_dtype="float32", max_pixels=64_000_000, max_patches=None,
                            warmup=True, dtype_policy="float32",
                            xla=execution.choose("float32")[0], runtime=execution.choose("float32")[1],
                            formats=["JPEG", "PNG", "GIF", "BMP", "WebP"],
                            signatures=["serving_default", "predict_images"],
                            data_config=keras_vit.data_config.paper_data_config(32))
    assert export.read_metadata(path) == metadata


def test_probabilities_are_not_trivial(exported):
    """Guards the tests below against a model whose outputs would match anything."""
    probabilities = expected_outputs(exported.model, np.random.default_rng(0).uniform(
        0, 255, (4, 32, 32, 3)))["probabilities"]
    assert probabilities.max() - probabilities.min() > 0.1
    assert len(set(probabilities.argmax(-1))) > 1


# ------------------------------------------------------------------------------------------
# Wire formats.


def test_rest_json_request_as_tf_serving_parses_it(exported, loaded, tmp_path):
    model = exported.model
    rng = np.random.default_rng(3)
    jpeg, png = (export_serving.encode(im, fmt) for im, fmt in zip(
        export_serving.sample_images(rng, [(50, 40), (32, 32)]), ("JPEG", "PNG")))
    (tmp_path / "cat.jpg").write_bytes(jpeg)
    # The documented shell line builds the body.
    subprocess.run(["bash", "-c", export_serving.REST_REQUEST_COMMAND], cwd=tmp_path, check=True)
    body = (tmp_path / "request.json").read_text()
    bytes_input = {"image_bytes": object}
    signature, inputs = export_serving.parse_rest_request(body, bytes_input)
    assert signature == "serving_default" and inputs["image_bytes"].tolist() == [jpeg]
    outputs = loaded.signatures[signature](image_bytes=tf.constant(inputs["image_bytes"]))
    response = export_serving.json.loads(
        export_serving.rest_response({k: v.numpy() for k, v in outputs.items()}))
    (prediction,) = response["predictions"]
    want = expected_outputs(model, decoded_and_resized([jpeg]))
    got = {k: np.array([v]) for k, v in prediction.items()}
    for name in ("probabilities", "top_k_scores"):  # JSON numbers carry no dtype
        got[name] = got[name].astype(np.float32)
    assert_outputs_match(got, want)
    assert any(label in CLASS_NAMES for label in prediction["top_k_labels"])

    # The other request layouts TF Serving accepts give the same tensors.
    b64 = export_serving.base64.b64encode
    for layout in (
        {"instances": [{"image_bytes": {"b64": b64(jpeg).decode()}},
                       {"image_bytes": {"b64": b64(png).decode()}}]},
        {"inputs": {"image_bytes": [{"b64": b64(jpeg).decode()}, {"b64": b64(png).decode()}]}},
        {"signature_name": "serving_default",
         "inputs": [{"b64": b64(jpeg).decode()}, {"b64": b64(png).decode()}]},
    ):
        _, inputs = export_serving.parse_rest_request(export_serving.json.dumps(layout),
                                                      bytes_input)
        assert inputs["image_bytes"].tolist() == [jpeg, png]
    got = loaded.signatures["serving_default"](image_bytes=tf.constant(inputs["image_bytes"]))
    assert_outputs_match(got, expected_outputs(model, decoded_and_resized([jpeg, png])))

    # predict_images over REST: nested lists of numbers.
    images = rng.uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    body = export_serving.json.dumps(
        {"signature_name": "predict_images", "instances": images.tolist()})
    signature, inputs = export_serving.parse_rest_request(body, {"images": np.float32})
    got = loaded.signatures[signature](images=tf.constant(inputs["images"]))
    assert_outputs_match(got, expected_outputs(model, images))


def test_grpc_predict_request_proto_and_client_example(exported, loaded, tmp_path, monkeypatch,
                                                       capsys):
    import grpc
    from tensorflow_serving.apis import predict_pb2

    model = exported.model
    rng = np.random.default_rng(4)
    images = export_serving.sample_images(rng, [(36, 36), (28, 44)])
    encoded = [export_serving.encode(images[0], "JPEG"), export_serving.encode(images[1], "PNG")]
    want = expected_outputs(model, decoded_and_resized(encoded))

    # A PredictRequest serialised, parsed back, converted with tf.make_ndarray and fed.
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "vit"
    request.model_spec.signature_name = "serving_default"
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(encoded))
    parsed = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    array = tf.make_ndarray(parsed.inputs["image_bytes"])
    assert array.tolist() == encoded
    signature = loaded.signatures[parsed.model_spec.signature_name]
    assert_outputs_match(signature(image_bytes=tf.constant(array)), want)

    # The serving guide's client, over a real gRPC channel to a PredictionService on the export.
    server, address = export_serving.start_grpc_server(export_serving.prediction_service(loaded))
    try:
        (tmp_path / "cat.jpg").write_bytes(encoded[0])
        monkeypatch.chdir(tmp_path)
        code = export_serving.GRPC_CLIENT_EXAMPLE.replace("localhost:8500", address)
        capsys.readouterr()
        exec(compile(code, "grpc_client_example", "exec"), {})
        lines = capsys.readouterr().out.splitlines()
        assert lines == [f"{label}: {score:.4f}" for label, score in
                         zip(want["top_k_labels"][0], want["top_k_scores"][0])]

        # Bad bytes: an INVALID_ARGUMENT status for that request, and the server goes on.
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        with grpc.insecure_channel(address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for bad in (encoded[0][: len(encoded[0]) // 2], b""):
                request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([bad]))
                with pytest.raises(grpc.RpcError) as error:
                    stub.Predict(request, timeout=30)
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "JPEG" in error.value.details()
            request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(encoded))
            response = stub.Predict(request, timeout=30)
        got = {name: tf.make_ndarray(response.outputs[name]) for name in OUTPUTS}
        assert_outputs_match(got, want)
    finally:
        server.stop(None)


def png_declaring(height, width):
    """A small, valid-looking PNG whose header declares `height` x `width` pixels."""
    data = bytearray(export_serving.encode(np.zeros((4, 4, 3), np.uint8), "PNG"))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")  # IHDR width, height
    return bytes(data)


def test_serving_default_reads_every_supported_format_and_refuses_others(exported, loaded):
    model = exported.model
    serve = loaded.signatures["serving_default"]
    images = export_serving.sample_images(np.random.default_rng(11), [
        (36, 30), (32, 32), (20, 44), (50, 50), (33, 31)])
    formats = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
    encoded = [export_serving.encode(im, fmt) for im, fmt in zip(images, formats)]
    assert [data[:2] for data in encoded] == [b"\xff\xd8", b"\x89P", b"GI", b"BM", b"RI"]
    assert encoded[4][8:12] == b"WEBP"
    # With an alpha channel, dropped as Pillow's convert("RGB") drops it (WebP's decoder
    # converts no channels: it gives RGBA).
    alpha = np.concatenate([images[1], np.full((32, 32, 1), 100, np.uint8)], axis=-1)
    encoded += [export_serving.encode(alpha, "WEBP"), export_serving.encode(alpha, "PNG")]
    want = expected_outputs(model, decoded_and_resized(encoded))
    assert_outputs_match(serve(image_bytes=tf.constant(encoded)), want)
    # Not an image format it decodes: a TIFF (PIL writes it; TF Serving's clients may send it).
    buffer = io.BytesIO()
    Image.fromarray(images[0]).save(buffer, format="TIFF")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="image_bytes is not an image in a supported format"):
        serve(image_bytes=tf.constant([encoded[0], buffer.getvalue()]))
    # An image whose header declares more than the default 64 million pixels is refused
    # before its pixels are decoded; one at the limit is not refused for its size.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"\[image_bytes declares\] \[8001\] \[x\] \[8000\] \[pixels, "
                             r"above the limit of 64000000 pixels"):
        serve(image_bytes=tf.constant([png_declaring(8001, 8000)]))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        serve(image_bytes=tf.constant([png_declaring(8000, 8000)]))  # then fails to decode
    assert "above the limit" not in error.value.message
    assert_outputs_match(serve(image_bytes=tf.constant(encoded[:1])),
                         {k: v[:1] for k, v in want.items()})  # and it goes on serving


@pytest.mark.parametrize("values, message", [
    ((np.nan, 10.0), r"images must be RGB pixels in \[0, 255\]. Received values from\] \[nan"),
    ((0.0, np.inf), r"images must be RGB pixels in \[0, 255\]"),
    ((0.0, 300.0), r"Received values from\] \[0\] \[to\] \[300\]"),
    ((-128.0, 127.0), r"Received values from\] \[-128\] \[to\] \[127\]"),
    ((0.0, 0.8), r"image\] \[0\] \[holds values up to\] \[0.3999\d*\] \[: scaled to \[0, 1\]"),
])
def test_predict_images_refuses_pixels_it_would_answer_wrongly(loaded, values, message):
    """NaN would go back as NaN scores with labels, other scales as confident answers: as
    preprocess_inputs refuses them in Python, the signature fails the request."""
    serve = loaded.signatures["predict_images"]
    images = np.linspace(*values, 2 * 32 * 32 * 3, dtype=np.float32).reshape(2, 32, 32, 3)
    images[0, 0, 0, 0] = values[0]  # NaN as the first value too
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        serve(images=tf.constant(images))
    dark = np.zeros((1, 32, 32, 3), np.float32)  # all black: in range, and served
    assert serve(images=tf.constant(dark))["probabilities"].shape == (1, len(CLASS_NAMES))


def test_predict_images_refuses_an_image_scaled_to_0_1_among_others(loaded):
    images = np.random.default_rng(4).uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    images[1] /= 255.0  # one client's image, batched with the others
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"images: image\] \[1\] \[holds values up to\] \[0.99"):
        loaded.signatures["predict_images"](images=tf.constant(images))


def test_warmup_records_are_prediction_logs_that_run(exported, loaded):
    from tensorflow_serving.apis import prediction_log_pb2

    model, path = exported.model, exported.path
    records = list(tf.data.TFRecordDataset(
        os.path.join(path, "assets.extra", "tf_serving_warmup_requests")).as_numpy_iterator())
    seen = []
    for record in records:
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        signature = request.model_spec.signature_name
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        got = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        if signature == "serving_default":
            (values,) = inputs.values()
            images = decoded_and_resized(values.tolist())
            formats = {bytes(v[:2]) for v in values.tolist()}
        else:
            images = inputs["images"]
            formats = set()
        assert_outputs_match(got, expected_outputs(model, images))
        seen.append((signature, len(images), formats))
    assert sorted(seen) == [("predict_images", 1, set()), ("predict_images", 2, set()),
                            ("serving_default", 1, {b"\xff\xd8"}),
                            ("serving_default", 2, {b"\xff\xd8", b"\x89P"})]


# ------------------------------------------------------------------------------------------
# Dtypes, XLA, the command line.


def test_mixed_precision_model_exports_float32_outputs(tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = random_model(seed=5)
    keras.config.set_dtype_policy("float32")
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    path = export.export_saved_model(model, tmp_path / "vit", warmup=False)
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["predict_images"]
    assert signature.structured_outputs["probabilities"].dtype == tf.float32
    images = np.random.default_rng(5).uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    want = expected_outputs(model, images, class_names=[str(i) for i in range(NUM_CLASSES)])
    # bfloat16 inside: the same computation, up to the order of roundings.
    assert_outputs_match(signature(images=tf.constant(images)), want, atol=2e-3)


# bfloat16 serving: the digits model's held-out images give the float32 export's top-1 classes,
# and probabilities within this of its (measured: 0.022).
BFLOAT16_PROBABILITY_TOLERANCE = 0.05


def test_a_bfloat16_export_agrees_with_the_float32_export_on_the_digits(tmp_path):
    from test_demo import held_out_split

    model = keras_vit.from_pretrained("digits")
    scaled, labels = held_out_split()
    images = tf.constant(((scaled + 1) * 127.5).astype(np.float32))  # [360, 16, 16, 3]
    outputs, metadata = {}, {}
    for precision in ("float32", "bfloat16"):
        path = export.export_saved_model(model, tmp_path / precision, precision=precision,
                                         warmup=False)
        signature = tf.saved_model.load(path).signatures["predict_images"]
        outputs[precision] = signature(images=images)["probabilities"].numpy()
        metadata[precision] = json.loads(
            (pathlib.Path(path) / "assets.extra" / "keras_vit.json").read_text())
        assert outputs[precision].dtype == np.float32
    assert [metadata[p]["dtype_policy"] for p in metadata] == ["float32", "mixed_bfloat16"]
    assert model.get_layer("encoderblock_0").compute_dtype == "float32"  # the model unchanged
    full, half = outputs["float32"], outputs["bfloat16"]
    assert np.mean(full.argmax(-1) == half.argmax(-1)) >= 0.99
    assert np.abs(full - half).max() <= BFLOAT16_PROBABILITY_TOLERANCE
    assert np.abs(full - half).max() > 1e-4  # bfloat16 inside, not the float32 graph again
    assert np.mean(half.argmax(-1) == labels) >= 0.97  # the demo's held-out accuracy


def test_precision_needs_a_float_keras_vit_model(tmp_path):
    inputs = keras.Input((32, 32, 3))
    plain = keras.Model(inputs, keras.layers.Dense(NUM_CLASSES)(
        keras.layers.GlobalAveragePooling2D()(inputs)))
    with pytest.raises(ValueError, match="precision='bfloat16' builds the model again in that "
                                         "precision, which needs a keras_vit model"):
        export.export_saved_model(plain, tmp_path / "a", precision="bfloat16")
    quantized = random_model(seed=9)
    quantized.quantize("int8")
    with pytest.raises(ValueError, match="int8-quantized. Expected a float model"):
        export.export_saved_model(quantized, tmp_path / "b", precision="bfloat16")
    with pytest.raises(ValueError, match="`precision` must be one of 'float32', 'bfloat16'"):
        export.export_saved_model(random_model(), tmp_path / "c", precision="fp16")
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "c")


# The serving graph's image ops: the header's JPEG size, the decoders (JPEG with its exact DCT;
# every other format) and the resize.
DECODE_OPS = {"ExtractJpegShape", "DecodeJpeg", "DecodeImage", "ResizeBilinear"}


def _xla_and_decode_functions(path):
    from tensorflow.core.protobuf import saved_model_pb2

    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved = saved_model_pb2.SavedModel.FromString(f.read())
    xla, decode_devices, dct_methods = [], {}, set()
    for function in saved.meta_graphs[0].graph_def.library.function:
        ops = {node.op: node.device for node in function.node_def}
        dct_methods.update(node.attr["dct_method"].s for node in function.node_def
                           if node.op == "DecodeJpeg")
        if function.attr["_XlaMustCompile"].b:
            xla.append(set(ops))
        decode_devices.update({op: device for op, device in ops.items()
                               if op in DECODE_OPS})
    return xla, decode_devices, dct_methods


def test_cli_saved_model_with_uint8_input_and_xla(tmp_path):
    model = random_model(seed=6)
    model.save(tmp_path / "tiny.keras")
    names = [f"name {i}" for i in range(NUM_CLASSES)]
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    code = cli.main(["export", str(tmp_path / "out"), "--model", str(tmp_path / "tiny.keras"),
                     "--version", "7", "--image-dtype", "uint8", "--jit-compile",
                     "--class-names", str(tmp_path / "names.txt"), "--top-k", "3",
                     "--no-warmup", "--max-pixels", "1000"])
    assert code == 0
    path = tmp_path / "out" / "7"
    assert sorted(os.listdir(tmp_path / "out")) == ["7"]
    assert os.listdir(path / "assets.extra") == ["keras_vit.json"]  # no warm-up records
    metadata = json.loads((path / "assets.extra" / "keras_vit.json").read_text())
    assert (metadata["image_dtype"], metadata["top_k"], metadata["max_pixels"],
            metadata["warmup"]) == ("uint8", 3, 1000, False)
    assert (path / "assets" / "labels.txt").read_text().splitlines() == names

    xla, decode_devices, dct_methods = _xla_and_decode_functions(str(path))
    assert xla and all("Conv2D" in ops for ops in xla)  # the forward pass is compiled ...
    assert all(not ops & DECODE_OPS for ops in xla)
    assert set(decode_devices) == DECODE_OPS
    assert set(decode_devices.values()) == {"/device:CPU:0"}  # ... the decoding is not.
    assert dct_methods == {b"INTEGER_ACCURATE"}  # libjpeg's exact DCT, as PIL decodes

    loaded = tf.saved_model.load(str(path))
    signature = loaded.signatures["predict_images"]
    assert signature.structured_input_signature[1]["images"].dtype == tf.uint8
    images = np.random.default_rng(6).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    got = signature(images=tf.constant(images))
    assert_outputs_match(got, expected_outputs(model, images, class_names=names, top_k=3))
    # --max-pixels 1000: 40 x 25 = 1000 pixels are served, 40 x 26 are refused.
    small, large = (export_serving.encode(im, "PNG") for im in export_serving.sample_images(
        np.random.default_rng(6), [(40, 25), (40, 26)]))
    serve = loaded.signatures["serving_default"]
    assert_outputs_match(serve(image_bytes=tf.constant([small])), expected_outputs(
        model, decoded_and_resized([small]), class_names=names, top_k=3))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"declares\] \[40\] \[x\] \[26\] \[pixels, above the limit "
                             r"of 1000 "):
        serve(image_bytes=tf.constant([small, large]))


def _own_tflite_run(path, images):
    interpreter = tf.lite.Interpreter(model_path=str(path))
    (detail,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(detail["index"], images.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], images)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_tflite_float32_and_dynamic_int8(tmp_path, capsys):
    model = random_model(seed=7)
    model.save(tmp_path / "tiny.keras")
    images = np.random.default_rng(7).uniform(0, 255, (16, 32, 32, 3)).astype(np.float32)
    want = expected_outputs(model, images)["probabilities"]
    outputs = {}
    for name, extra in (("float", []), ("int8", ["--quantize", "dynamic-int8"])):
        path = tmp_path / f"{name}.tflite"
        capsys.readouterr()
        assert cli.main(["export", str(path), "--model", str(tmp_path / "tiny.keras"),
                         "--format", "tflite", *extra]) == 0
        printed = capsys.readouterr().out
        match = re.search(r"max \|probability difference\| (\S+), top-1 agreement (\S+)%",
                          printed)
        assert match, printed
        outputs[name] = (_own_tflite_run(path, images), float(match[1]), os.path.getsize(path))
        for batch in (1, 3):  # dynamic batch
            assert _own_tflite_run(path, images[:batch]).shape == (batch, NUM_CLASSES)

    got, printed_diff, float_size = outputs["float"]
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert printed_diff <= 1e-4
    got8, _, int8_size = outputs["int8"]
    assert int8_size < 0.6 * float_size  # the weights are int8
    # Dynamic-range int8 is an approximation: close, and its top-1 agreement is what
    # tflite_parity reports.
    np.testing.assert_allclose(got8, want, atol=0.05)
    assert np.abs(got8 - want).max() > 1e-6  # really quantised
    parity = tflite.tflite_parity(tmp_path / "int8.tflite", model, images)
    assert parity["top1_agreement"] == np.mean(got8.argmax(-1) == want.argmax(-1))
    assert parity["max_abs_diff"] == pytest.approx(np.abs(got8 - want).max(), abs=1e-6)


def test_tflite_command_fails_when_float32_parity_fails(tmp_path, monkeypatch, capsys):
    random_model().save(tmp_path / "tiny.keras")
    monkeypatch.setattr(tflite, "export_tflite", lambda model, path, quantize, overwrite:
                        pathlib.Path(path).write_bytes(b""))
    for index, broken in enumerate((np.nan, 0.5)):  # a file whose outputs are NaN, or wrong
        monkeypatch.setattr(tflite, "run_tflite", lambda path, images, v=broken: np.full(
            (len(images), NUM_CLASSES), v, np.float32))
        assert cli.main(["export", str(tmp_path / f"m{index}.tflite"), "--model",
                         str(tmp_path / "tiny.keras"), "--format", "tflite"]) == 1
        assert "differs from Keras by more than 0.0001" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# Bad input.


def test_bad_models_and_arguments_are_refused(tmp_path, monkeypatch):
    unbuilt = keras.Sequential([keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="is not built"):
        export.export_saved_model(unbuilt, tmp_path)
    inputs = keras.Input((None, None, 3))
    any_size = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(
        inputs)))
    with pytest.raises(ValueError, match=r"known height and width.*\(None, None, None, 3\)"):
        export.export_saved_model(any_size, tmp_path)
    with pytest.raises(TypeError, match="Expected a keras.Model.*str"):
        export.export_saved_model("vit.keras", tmp_path)
    gray = keras.Input((8, 8, 1))
    two = keras.Input((8, 8, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(two)
    for bad, message in (
            (keras.Model([two, gray], keras.layers.Dense(3)(pooled)),
             "one image input and one logits output. Received 2 inputs and 1 outputs"),
            (keras.Model(gray, keras.layers.Dense(3)(keras.layers.Flatten()(gray))),
             r"input \[batch, height, width, 3\]. Received input shape \(None, 8, 8, 1\)"),
            (keras.Model(two, keras.layers.Dense(3)(two)),
             r"output of logits \[batch, num_classes\] \(include_top=True\). Received output "
             r"shape \(None, 8, 8, 3\)")):
        with pytest.raises(ValueError, match=message):
            export.export_saved_model(bad, tmp_path)
    not_a_vit = keras.Model(two, keras.layers.Dense(3)(pooled))
    with pytest.raises(ValueError, match="`features` exports the blocks of a keras_vit model: "):
        export.export_saved_model(not_a_vit, tmp_path, features=dict(indices=[0]))
    with pytest.raises(ValueError, match=r"keras_vit.json does not exist. Expected the version "
                                         "folder of a keras_vit SavedModel export"):
        export.read_metadata(tmp_path)
    for kwargs, last in (({}, "pool"), ({"representation_size": 8}, "pre_logits")):
        headless = keras_vit.ViT(include_top=False, **TINY, **kwargs)
        with pytest.raises(ValueError, match=f"ends with its '{last}' layer.*include_top=False"):
            export.export_saved_model(headless, tmp_path)
    model = random_model()
    with pytest.raises(ValueError, match="class_names has 2 names but the model has 10"):
        export.export_saved_model(model, tmp_path, class_names=["a", "b"])
    with pytest.raises(ValueError, match=r"class_names\[3\] = 'x\\ny' contains a line break"):
        export.export_saved_model(model, tmp_path, class_names=list("abc") + ["x\ny"] + list(
            "efghij"))
    with pytest.raises(ValueError, match="class_names must be a list of str"):
        export.export_saved_model(model, tmp_path, class_names="abcdefghij")
    with pytest.raises(ValueError,
                       match="version` must be a non-negative integer. Received: version=-1"):
        export.export_saved_model(model, tmp_path, version=-1)
    with pytest.raises(ValueError, match="Received: version='2'"):
        export.export_saved_model(model, tmp_path, version="2")
    with pytest.raises(ValueError, match="top_k` must be a positive integer. Received: top_k=0"):
        export.export_saved_model(model, tmp_path, top_k=0)
    with pytest.raises(ValueError, match="max_pixels` must be a positive integer. Received: "
                                         "max_pixels=0"):
        export.export_saved_model(model, tmp_path, max_pixels=0)
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match=f"warmup` must be 'auto', True or False. "
                                             f"Received: warmup={bad!r}"):
            export.export_saved_model(model, tmp_path, warmup=bad)
    with pytest.raises(ValueError, match="top_k` must be a positive integer. Received: top_k=0"):
        export.export_saved_model(model, tmp_path, top_k=0)
    with pytest.raises(ValueError, match="image_dtype.*'float32', 'uint8'.*'float16'"):
        export.export_saved_model(model, tmp_path, image_dtype="float16")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="file is a file. Expected a folder"):
        export.export_saved_model(model, tmp_path / "file")
    with pytest.raises(ValueError, match="quantize.*Received: quantize='int4'"):
        tflite.export_tflite(model, tmp_path / "m.tflite", quantize="int4")
    for policy in ("mixed_bfloat16", "float16"):  # the converter has no kernels for them
        half = keras_vit.ViT(**dict(TINY, dtype=policy))
        with pytest.raises(ValueError, match=f"computes in {policy.split('_')[-1]} .*: the "
                                             "TFLite converter takes float32 models only"):
            tflite.export_tflite(half, tmp_path / "m.tflite")
    assert not (tmp_path / "m.tflite").exists()
    with monkeypatch.context() as patch:
        patch.setattr(keras.backend, "backend", lambda: "jax")
        with pytest.raises(ValueError, match="TensorFlow backend.*Received backend 'jax'"):
            export.export_saved_model(model, tmp_path)
    with monkeypatch.context() as patch:  # tensorflow-serving-api missing: warm-up asked for
        patch.setitem(sys.modules, "tensorflow_serving.apis", None)
        with pytest.raises(ImportError, match="pip install 'tensorflow-serving-api>=2.21,<2.22'"):
            export.export_saved_model(model, tmp_path, warmup=True)
    assert os.listdir(tmp_path) == ["file"]  # nothing written by any refused call
    with monkeypatch.context() as patch:  # ... and by default: an export without warm-up
        patch.setitem(sys.modules, "tensorflow_serving.apis", None)
        path = pathlib.Path(export.export_saved_model(model, tmp_path / "auto"))
    assert path == tmp_path / "auto" / "1"
    assert os.listdir(path / "assets.extra") == ["keras_vit.json"]
    assert json.loads((path / "assets.extra" / "keras_vit.json").read_text())["warmup"] is False


def test_cli_errors_name_the_problem(tmp_path, capsys):
    code = cli.main(["export", str(tmp_path / "out"), "--model", "B/16", "--quantize",
                     "dynamic-int8"])
    assert code == 2
    assert "--quantize does not apply to --format saved_model" in capsys.readouterr().err
    code = cli.main(["export", str(tmp_path / "m.tflite"), "--model", "B/16", "--format",
                     "tflite", "--top-k", "3", "--version", "2"])
    assert code == 2
    assert "--version, --top-k does not apply to --format tflite" in capsys.readouterr().err
    code = cli.main(["export", str(tmp_path / "out"), "--model", str(tmp_path / "none.keras")])
    assert code == 2
    assert "none.keras: no such file" in capsys.readouterr().err
    code = cli.main(["export", str(tmp_path / "out"), "--model", str(tmp_path / "x.keras"),
                     "--weights", "default"])
    assert code == 2
    assert "--weights default needs a variant --model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", str(tmp_path / "m.tflite"), "--model", "x.keras", "--format",
                  "tflite", "--parity-images", "0"])
    assert exit_info.value.code == 2
    assert "argument --parity-images: expected a positive integer. Received: '0'" in (
        capsys.readouterr().err)
    assert not os.listdir(tmp_path)  # nothing written


def test_existing_version_is_refused_and_replaced_only_whole(exported, tmp_path, monkeypatch):
    model, path = exported.model, exported.path
    base = tmp_path / "vit"
    shutil.copytree(path, base / "1")
    before = sorted(os.listdir(base / "1"))
    with pytest.raises(ValueError, match=r"vit/1 already holds an export.*overwrite=True"):
        export.export_saved_model(model, base, version=1)

    def fails_halfway(model, path, *args):
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "_write_saved_model", fails_halfway)
    with pytest.raises(RuntimeError, match="disk full"):  # over an existing export
        export.export_saved_model(model, base, version=1, overwrite=True)
    # An empty version folder is no export: no overwrite needed, and no leftover either.
    os.makedirs(base / "2")
    with pytest.raises(RuntimeError, match="disk full"):
        export.export_saved_model(model, base, version=2)
    assert sorted(os.listdir(base)) == ["1", "2"]  # no staging folder left behind
    assert sorted(os.listdir(base / "1")) == before and os.listdir(base / "2") == []
    monkeypatch.undo()

    names = [f"new {i}" for i in range(NUM_CLASSES)]
    export.export_saved_model(model, base, version=1, class_names=names, warmup=False,
                              overwrite=True)
    assert sorted(os.listdir(base)) == ["1", "2"]
    # The old export is gone, not merged: no warm-up records, the new metadata.
    assert os.listdir(base / "1" / "assets.extra") == ["keras_vit.json"]
    assert json.loads((base / "1" / "assets.extra" / "keras_vit.json").read_text())[
        "warmup"] is False
    assert (base / "1" / "assets" / "labels.txt").read_text().splitlines() == names
    images = np.random.default_rng(8).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    got = tf.saved_model.load(str(base / "1")).signatures["predict_images"](
        images=tf.constant(images))
    assert_outputs_match(got, expected_outputs(model, images, class_names=names))


# ------------------------------------------------------------------------------------------
# The background tools: saved_model_cli (signature defs; the TF1 Session loader) and a process
# with TensorFlow only.


def test_saved_model_cli_show_lists_the_serving_signatures(exported):
    assert os.path.basename(exported.path) == "1"
    text = exported.tools.output("show")
    signatures = {name: (body, method) for name, body, method in re.findall(
        r"signature_def\['(\w+)'\]:\n(.*?)Method name is: ?(\S*)\n", text, re.DOTALL)}
    assert {"serving_default", "predict_images"} <= set(signatures)

    def tensors(body, kind):
        section = body.split(f"contains the following {kind}(s):")[1]
        if kind == "input":
            section = section.split("contains the following output(s):")[0]
        return {name: (dtype, shape) for name, dtype, shape in re.findall(
            r"\['(\w+)'\] tensor_info:\n\s+dtype: (\w+)\n\s+shape: (\([^)]*\))", section)}

    outputs = {"probabilities": ("DT_FLOAT", f"(-1, {NUM_CLASSES})"),
               "top_k_scores": ("DT_FLOAT", f"(-1, {TOP_K})"),
               "top_k_indices": ("DT_INT32", f"(-1, {TOP_K})"),
               "top_k_labels": ("DT_STRING", f"(-1, {TOP_K})")}
    for name, inputs in (("serving_default", {"image_bytes": ("DT_STRING", "(-1)")}),
                         ("predict_images", {"images": ("DT_FLOAT", "(-1, 32, 32, 3)")})):
        body, method = signatures[name]
        assert method == "tensorflow/serving/predict", name
        assert tensors(body, "input") == inputs, name
        assert tensors(body, "output") == outputs, name


def test_saved_model_cli_run_predict_images_matches_keras(exported):
    """`saved_model_cli run` loads with the TF1 Session loader, as TF Serving does."""
    exported.tools.output("run")
    out = exported.work / "cli_out"
    got = {name: np.load(out / f"{name}.npy", allow_pickle=True) for name in OUTPUTS}
    assert_outputs_match(got, expected_outputs(exported.model, exported.cli_images))


def test_fresh_process_without_keras_matches_keras_on_both_signatures(exported):
    exported.tools.output("fresh")
    expected = {}
    for i in range(2):
        inputs = exported.fresh_inputs
        expected[f"predict_images_{i}"] = expected_outputs(exported.model, inputs[f"images_{i}"])
        expected[f"serving_default_{i}"] = expected_outputs(
            exported.model, decoded_and_resized(inputs[f"bytes_{i}"]))
    results = np.load(exported.work / "outputs.npz", allow_pickle=True)
    assert results["imported_keras"].size == 0
    for key, want in expected.items():
        got = {name: results[f"{key}_{name}"] for name in OUTPUTS}
        assert got["probabilities"].shape[0] == want["probabilities"].shape[0]
        assert_outputs_match(got, want)
    # Bytes that are not an image fail that request with a message naming what was received;
    # the process goes on serving.
    message = str(results["invalid_error"])
    assert ("image_bytes is not an image in a supported format. Expected one of JPEG, PNG, "
            "GIF, BMP, WebP") in message
    # Its length and first 8 bytes (as numbers: a request's bytes need not be text).
    first_bytes = " ".join(str(b) for b in b"this is not an image"[:8])
    assert "[20]" in message and f"[{first_bytes}]" in message, message
    after = {name: results[f"after_error_{name}"] for name in OUTPUTS}
    assert_outputs_match(after, expected["serving_default_0"])


def test_documented_serving_examples_are_the_tested_ones():
    root = pathlib.Path(HERE).parent
    readme = (root / "README.md").read_text()
    guide = (root / "docs" / "guides" / "serving.md").read_text()
    rest = (export_serving.REST_REQUEST_COMMAND, export_serving.REST_CURL_COMMAND)
    for example in rest:
        assert example in readme
    for example in (*rest, export_serving.GRPC_CLIENT_EXAMPLE):
        assert example in guide
