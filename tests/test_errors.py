"""Bad input and faults, as a table: every case names the input, the error it must raise, a phrase
its one-line message must contain, and what must be unchanged afterwards (model weights, files,
caches, exports, backups). The command line's cases assert exit status 2 (1 for a diverged run)
and no traceback; a few run in a real subprocess."""

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, export, images, labels, training, weights
from keras_vit.weights import CheckpointError

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
            num_classes=3)
TINY_JSON = json.dumps({k: v for k, v in TINY.items() if k != "num_classes"})


class CommandFailed(Exception):
    """A command line run that exited with the expected non-zero status."""

    def __init__(self, status, stderr):
        super().__init__(stderr)
        self.status = status


class Context:
    """What a case works on: a folder, a tiny model, and writers of real files."""

    def __init__(self, tmp_path, capsys):
        self.tmp = tmp_path
        self.capsys = capsys
        self.model = keras_vit.ViT(**TINY)
        self.model_before = weights.model_params(self.model)
        self.good = tmp_path / "good.npz"
        weights.save_npz(self.model, self.good)

    def params(self):
        return dict(weights.read_npz(self.good))

    def write_npz(self, name, **changes):
        params = self.params()
        params.update(changes)
        path = self.tmp / name
        np.savez(path, **params)
        return path

    def write_image(self, name, fmt="PNG", size=(20, 24), data=None):
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            pixels = np.random.default_rng(0).integers(0, 256, (*size, 3), np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, fmt)
            data = buffer.getvalue()
        path.write_bytes(data)
        return path

    def folder(self, classes=3, per_class=4, corrupt=()):
        root = self.tmp / "images"
        for c in range(classes):
            for i in range(per_class):
                self.write_image(f"images/class{c}/{i}.png")
        for name in corrupt:
            self.write_image(f"images/{name}", data=b"\x89PNG\r\n\x1a\n broken")
        return root

    def cli(self, *argv, status=2):
        code = cli.main([str(a) for a in argv])
        err = self.capsys.readouterr().err
        assert "Traceback" not in err
        if code == 0:
            return
        assert code == status, (code, err)
        raise CommandFailed(code, err)

    def model_unchanged(self):
        after = weights.model_params(self.model)
        for key, value in self.model_before.items():
            np.testing.assert_array_equal(after[key], value, err_msg=key)

    def files(self, root=None):
        root = pathlib.Path(root or self.tmp)
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}


@dataclasses.dataclass
class Case:
    name: str
    action: object  # Context -> anything; must raise
    error: type
    phrase: str
    unchanged: str = "model"  # "model", "files" (nothing under tmp written or changed), "none"


def load(path_fn):
    return lambda ctx: keras_vit.load_pretrained(ctx.model, str(path_fn(ctx)))


def posemb_key():
    return weights.layouts.POSEMB_KEY


def truncated_npy(ctx):
    """An npz whose member's data is shorter than its header declares."""
    path = ctx.write_npz("short.npz")
    raw = io.BytesIO()
    np.save(raw, np.zeros((4, 4), np.float32))
    member = raw.getvalue()[:-8]
    import zipfile

    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("extra.npy", member)
    return path


def huge_header_npy(ctx):
    """An npz whose member declares terabytes in a 100-byte file."""
    import zipfile

    path = ctx.tmp / "huge.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(posemb_key() + ".npy", header.getvalue() + b"\0" * 64)
    return path


def fit_tiny(ctx, output, lr=0.01, epochs=2, **kwargs):  # noqa: ARG001
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8)
    y = np.arange(12) % 3
    train = data.from_arrays(x, y, num_classes=3, image_size=16, batch_size=4, training=True)
    model = keras_vit.ViT(**TINY)
    return training.fit(model, train, output_dir=output, epochs=epochs, learning_rate=lr,
                        verbose=0, jit_compile=False, **kwargs)


def finished_run(ctx):
    fit_tiny(ctx, ctx.tmp / "run")
    ctx.run_files = ctx.files(ctx.tmp / "run")
    fit_tiny(ctx, ctx.tmp / "run")


def changed_run(ctx):
    output = ctx.tmp / "run"
    fit_tiny(ctx, output, epochs=1)  # leaves a finished run: make it unfinished again
    backup = training.backup_dir(output)
    os.makedirs(backup, exist_ok=True)
    (pathlib.Path(output) / "run.json").write_text(json.dumps(
        {"settings": json.loads((pathlib.Path(output) / "run.json").read_text())["settings"],
         "finished": False}))
    fit_tiny(ctx, output, epochs=3)


def corrupt_pointer(ctx):
    backup = pathlib.Path(training.backup_dir(ctx.tmp / "run"))
    backup.mkdir(parents=True)
    (backup / "latest.json").write_text('{"epoch": "one"')
    fit_tiny(ctx, ctx.tmp / "run")


def corrupt_backup(ctx):
    backup = pathlib.Path(training.backup_dir(ctx.tmp / "run"))
    (backup / "epoch-000001").mkdir(parents=True)
    (backup / "epoch-000001" / "model.weights.h5").write_bytes(b"not hdf5")
    (backup / "latest.json").write_text('{"epoch": 1, "dir": "epoch-000001"}')
    fit_tiny(ctx, ctx.tmp / "run")


def overwrite_with_bad_arguments(ctx):
    fit_tiny(ctx, ctx.tmp / "run")
    ctx.run_files = ctx.files(ctx.tmp / "run")
    fit_tiny(ctx, ctx.tmp / "run", lr=-1.0, overwrite=True)


def truncated_jpeg(ctx):
    whole = ctx.write_image("whole.jpg", fmt="JPEG").read_bytes()
    return ctx.write_image("cut.jpg", data=whole[:120])


def timm_file(ctx, **changes):
    """A timm-layout safetensors file of the context's model, with `changes` applied."""
    from safetensors.numpy import save_file

    from keras_vit.weights import torch_layouts

    params = torch_layouts.to_timm(weights.model_params(ctx.model))
    params.update({k: v for k, v in changes.items() if v is not None})
    for key in [k for k, v in changes.items() if v is None]:
        del params[key]
    path = ctx.tmp / "timm.safetensors"
    save_file(params, str(path))
    (ctx.tmp / "config.json").write_text(json.dumps(  # as timm's save_for_hf writes it
        {"architecture": "vit_tiny_patch16_224", "num_classes": 3,
         "model_args": {"num_heads": 2, "embed_dim": 8}}))
    return path


def serve(ctx, payload, max_pixels=10_000):
    path = export.export_saved_model(ctx.model, ctx.tmp / "export", warmup=False,
                                     max_pixels=max_pixels)
    signature = tf.saved_model.load(path).signatures["serving_default"]
    return signature(image_bytes=tf.constant([payload]))


def png_declaring(width, height):
    """A real PNG whose header declares width x height pixels (its data is tiny)."""
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, "PNG")
    raw = bytearray(buffer.getvalue())
    raw[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    return bytes(raw)


def tiff_bytes():
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "TIFF")
    return buffer.getvalue()


def class_names_file(ctx, content):
    path = ctx.tmp / "names.txt"
    path.write_bytes(content)
    return path


CASES = [
    # -- Checkpoints: every array is checked before any is assigned. -------------------------
    Case("npz string array last", load(lambda c: c.write_npz(
        "s.npz", **{"Transformer/encoder_norm/scale": np.array(["a"] * 8)})),
        CheckpointError, "dtype <U1, expected a floating-point array"),
    Case("npz complex array", load(lambda c: c.write_npz(
        "c.npz", cls=np.zeros((1, 1, 8), np.complex64))), CheckpointError, "dtype complex64"),
    Case("npz bool array", load(lambda c: c.write_npz(
        "b.npz", cls=np.zeros((1, 1, 8), bool))), CheckpointError, "cls: dtype bool"),
    Case("npz int array", load(lambda c: c.write_npz(
        "i.npz", cls=np.zeros((1, 1, 8), np.int64))), CheckpointError, "cls: dtype int64"),
    Case("npz NaN", load(lambda c: c.write_npz(
        "n.npz", cls=np.full((1, 1, 8), np.nan, np.float32))), CheckpointError,
        "cls: 8 non-finite values"),
    Case("npz infinity", load(lambda c: c.write_npz(
        "f.npz", **{"embedding/bias": np.full(8, np.inf, np.float32)})), CheckpointError,
        "embedding/bias: 8 non-finite values"),
    Case("npz header declares terabytes", load(huge_header_npy), CheckpointError,
         "declares shape (1048576, 1048576)"),
    Case("npz data shorter than its header", load(truncated_npy), CheckpointError,
         "the file is truncated or corrupted"),
    Case("npz pickled object", load(lambda c: c.write_npz(
        "p.npz", evil=np.array([{"a": 1}], dtype=object))), CheckpointError,
        "holds pickled Python objects"),
    Case("npz not a zip", load(lambda c: (c.tmp / "x.npz").write_text("<html>") and
                                c.tmp / "x.npz"), CheckpointError, "not an .npz checkpoint"),
    Case("npz wrong shape", load(lambda c: c.write_npz(
        "w.npz", cls=np.zeros((1, 1, 9), np.float32))), CheckpointError,
        "shape mismatch: cls: file (1, 1, 9), model (1, 1, 8)"),
    Case("npz missing key", load(lambda c: np.savez(
        c.tmp / "m.npz", **{k: v for k, v in c.params().items() if k != "cls"})
        or c.tmp / "m.npz"), CheckpointError, "missing keys (1): cls"),
    Case("npz unexpected key", load(lambda c: c.write_npz(
        "u.npz", extra=np.zeros(3, np.float32))), CheckpointError, "unexpected keys (1): extra"),
    Case("npz missing file", load(lambda c: c.tmp / "absent.npz"), FileNotFoundError,
         "No checkpoint file at"),
    Case("registry name unknown", lambda c: keras_vit.load_pretrained(c.model, "imagenet21k/B_16"),
         ValueError, "Unknown checkpoint 'imagenet21k/B_16'"),
    Case("weights source not understood", lambda c: keras_vit.load_pretrained(c.model, 3),
         ValueError, "pretrained=3 is not understood"),
    # -- The registry and the download cache. -------------------------------------------------
    Case("registered name escapes the cache", lambda c: keras_vit.register_checkpoint(
        "../../escaped", "file:///x.npz"), ValueError, "Checkpoint name '../../escaped' is not valid",
        "files"),
    Case("registered sha256 malformed", lambda c: keras_vit.register_checkpoint(
        "mine/x", "file:///x.npz", sha256="abc"), ValueError, "64 hexadecimal digits", "files"),
    Case("registered URL scheme", lambda c: keras_vit.register_checkpoint(
        "mine/y", "ftp://host/x.npz"), ValueError, "Expected an http://, https:// or file:// URL",
        "files"),
    Case("registered unknown field", lambda c: keras_vit.register_checkpoint(
        "mine/z", "file:///x.npz", resolutoin=224), ValueError, "Unknown registry fields",
        "files"),
    # -- Model arguments. ------------------------------------------------------------------------
    Case("gelu_approximate a string", lambda c: keras_vit.ViT(gelu_approximate="no"), ValueError,
         "`gelu_approximate` must be True or False. Received: gelu_approximate='no'"),
    Case("include_top a string", lambda c: keras_vit.ViT(include_top="yes"), ValueError,
         "`include_top` must be True or False"),
    Case("zero layers", lambda c: keras_vit.ViT(num_layers=0), ValueError,
         "`num_layers` must be a positive integer"),
    Case("heads do not divide width", lambda c: keras_vit.ViT(hidden_size=100, num_heads=12),
         ValueError, "hidden_size 100 is not divisible by num_heads 12"),
    Case("image not divisible by patch", lambda c: keras_vit.ViT(image_size=225), ValueError,
         "image_size height 225 is not divisible by patch_size 16"),
    Case("dropout of 1.5", lambda c: keras_vit.TransformerBlock(2, 8, dropout_rate=1.5),
         ValueError, "`dropout_rate` must be a number in [0, 1)"),
    Case("NaN epsilon", lambda c: keras_vit.TransformerBlock(2, 8, layer_norm_epsilon=float("nan")),
         ValueError, "`layer_norm_epsilon` must be a number in (0, inf)"),
    Case("unknown variant", lambda c: keras_vit.create_model("B/15"), ValueError,
         "Unknown ViT variant 'B/15'"),
    # -- Data. --------------------------------------------------------------------------------
    Case("float images without their range", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.float32), np.arange(4) % 2, image_size=8, batch_size=2,
        training=False), ValueError, "say their range with value_range=(0, 255)", "files"),
    Case("float images outside their range", lambda c: data.from_arrays(
        np.full((4, 8, 8, 3), 200.0), np.arange(4) % 2, image_size=8, batch_size=2,
        training=False, value_range=(0, 1)), ValueError, "outside value_range (0, 1)", "files"),
    Case("float labels", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4), image_size=8, batch_size=2,
        training=False), ValueError, "`labels` must be integers", "files"),
    Case("labels out of range", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 5, 1]), num_classes=3, image_size=8,
        batch_size=2, training=False), ValueError, "Labels out of range: [5]", "files"),
    Case("batch larger than the split", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2, image_size=8, batch_size=8,
        training=True), ValueError, "fewer than one batch of 8", "files"),
    Case("negative start epoch", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2, image_size=8, batch_size=2,
        training=True, start_epoch=-1), ValueError, "`start_epoch` must be a non-negative",
        "files"),
    Case("missing image folder", lambda c: data.from_folder(
        c.tmp / "none", image_size=8, batch_size=2, training=False), FileNotFoundError,
        "does not exist", "files"),
    Case("image folder without images", lambda c: (c.tmp / "empty" / "a").mkdir(parents=True)
         or data.from_folder(c.tmp / "empty", image_size=8, batch_size=2, training=False),
         ValueError, "has no images", "none"),
    Case("image folder all corrupt, skipped", lambda c: data.from_folder(
        c.folder(classes=0, corrupt=["a/x.png", "b/y.png"]), image_size=8, batch_size=2,
        training=False, skip_corrupt=True), ValueError, "none of its images can be decoded",
        "none"),
    Case("unknown tfds data set", lambda c: data.from_tfds(
        "mnist2", "train", image_size=8, batch_size=2), ValueError, "Unknown dataset 'mnist2'",
        "files"),
    Case("one class to train on", lambda c: training.fit(
        c.model, data.from_arrays(np.zeros((4, 16, 16, 3), np.uint8), np.zeros(4, int),
                                  image_size=16, batch_size=2, training=True),
        output_dir=c.tmp / "run", epochs=1), ValueError, "a classifier needs at least 2"),
    # -- Images. --------------------------------------------------------------------------------
    Case("image file missing", lambda c: images.load_image(c.tmp / "no.png", 8),
         FileNotFoundError, "no.png does not exist", "files"),
    Case("image file is text", lambda c: images.load_image(
        c.write_image("t.png", data=b"hello, world"), 8), ValueError,
        "t.png is not an image in a supported format", "none"),
    Case("image file is TIFF", lambda c: images.load_image(
        c.write_image("t.tif", data=tiff_bytes()), 8), ValueError,
        "Expected one of JPEG, PNG, GIF, BMP, WebP", "none"),
    Case("image declares 20000 x 20000", lambda c: images.load_image(
        c.write_image("big.png", data=png_declaring(20000, 20000)), 8), ValueError,
        "PNG image of 20000 x 20000 pixels, above the limit", "none"),
    Case("JPEG header truncated", lambda c: images.load_image(truncated_jpeg(c), 8), ValueError,
         "cut.jpg is not a readable JPEG image", "none"),
    Case("image data truncated", lambda c: images.load_image(
        c.write_image("cut.png", data=c.write_image("whole.png").read_bytes()[:60]), 8),
        ValueError, "Cannot read", "none"),
    # -- Class names and predictions. --------------------------------------------------------------
    Case("class names not UTF-8", lambda c: labels.read_class_names(
        class_names_file(c, b"caf\xe9\ndog\n")), ValueError, "is not UTF-8 text", "none"),
    Case("class names with a blank line", lambda c: labels.read_class_names(
        class_names_file(c, b"cat\n\ndog\n")), ValueError, "line 2 is blank", "none"),
    Case("class names count", lambda c: labels.read_class_names(
        class_names_file(c, b"cat\ndog\n"), num_classes=3), ValueError,
        "has 2 names but the model has 3 classes", "none"),
    Case("top-0 predictions", lambda c: labels.decode_predictions(np.zeros((1, 3)), top=0,
                                                                  class_names=list("abc")),
         ValueError, "`top` must be a positive integer", "files"),
    # -- Training runs. ------------------------------------------------------------------------
    Case("diverged run", lambda c: fit_tiny(c, c.tmp / "run", lr=1e30), training.TrainingDiverged,
         "Training diverged", "none"),
    Case("finished run run again", finished_run, training.RunFinished, "finished (2 epochs)",
         "none"),
    Case("resumed with other settings", changed_run, ValueError,
         "was started with other settings (epochs 1 -> 3", "none"),
    Case("corrupt backup pointer", corrupt_pointer, training.BackupError,
         "backup pointer", "none"),
    Case("corrupt backup weights", corrupt_backup, training.BackupError, "cannot be restored",
         "none"),
    Case("epochs and steps both", lambda c: training.fit(
        c.model, data.from_arrays(np.zeros((4, 16, 16, 3), np.uint8), np.arange(4) % 2,
                                  image_size=16, batch_size=2, training=True),
        output_dir=c.tmp / "run", epochs=1, steps=2), ValueError,
        "Give exactly one of `epochs` and `steps`"),
    Case("warm-up longer than the run", lambda c: training.WarmupDecay(0.1, 10, 10),
         ValueError, "warmup_steps 10 must be smaller than total_steps 10", "files"),
    Case("accumulation not a divisor", lambda c: training.accumulation_steps(100, 64),
         ValueError, "target_batch_size 100 is not a multiple of batch_size 64", "files"),
    Case("output folder is a file", lambda c: training.training_callbacks(
        c.write_image("f.png") / "run"), ValueError, "is not writable", "none"),
    Case("overwrite with bad arguments", overwrite_with_bad_arguments, ValueError,
         "`learning_rate` must be a number in (0, inf)", "none"),
    # -- Weights in other layouts. -------------------------------------------------------------
    Case("timm file with an array ViT has no place for", load(lambda c: timm_file(
        c, **{"norm_pre.bias": np.zeros(8, np.float32)})), CheckpointError,
        "has arrays keras_vit's ViT has no place for: norm_pre.bias", "none"),
    Case("timm file without the patch bias", load(lambda c: timm_file(
        c, **{"patch_embed.proj.bias": None})), CheckpointError,
        "The timm checkpoint has no 'patch_embed.proj.bias'", "none"),
    Case("a hybrid written in timm's layout", lambda c: weights.torch_layouts.to_timm(
        weights.model_params(keras_vit.ViT(**dict(TINY, image_size=32, patch_size=1,
                                                   resnet={"num_layers": (1,)})))),
        CheckpointError, "cannot be written in timm's layout", "files"),
    Case("a 2-D position embedding written in timm's layout",
         lambda c: weights.torch_layouts.to_timm(weights.model_params(keras_vit.ViT(
             **dict(TINY, position_embedding="learned_2d")))),
         CheckpointError, "learned 2-D position embedding (position_embedding='learned_2d'); "
         "timm's VisionTransformer holds a learned 1-D table", "files"),
    Case("a fixed position embedding written in timm's layout",
         lambda c: weights.torch_layouts.to_timm(weights.model_params(keras_vit.ViT(
             **dict(TINY, position_embedding="sincos_2d")))),
         CheckpointError, "no learned position embedding (position_embedding='sincos_2d' or "
         "'none')", "files"),
    # -- Export and serving. ------------------------------------------------------------------------
    Case("export a model without head", lambda c: export.export_saved_model(
        keras_vit.ViT(**dict(TINY, include_top=False)), c.tmp / "e"), ValueError,
        "not class logits", "files"),
    Case("serve a TIFF", lambda c: serve(c, tiff_bytes()), tf.errors.InvalidArgumentError,
         "not an image in a supported format", "none"),
    Case("serve an image above the pixel limit", lambda c: serve(c, png_declaring(200, 200)),
         tf.errors.InvalidArgumentError, "above the limit of 10000 pixels", "none"),
    Case("export over an existing version", lambda c: [
        export.export_saved_model(c.model, c.tmp / "e", warmup=False),
        setattr(c, "export_files", c.files(c.tmp / "e")),
        export.export_saved_model(c.model, c.tmp / "e", warmup=False)],
        ValueError, "already holds an export", "none"),
    # -- The command line, in process: exit status 2 and one line, no traceback. -------------------
    Case("cli predict a missing image", lambda c: c.cli("predict", c.tmp / "missing.jpg",
                                                        "--weights", c.good),
         CommandFailed, "missing.jpg does not exist", "files"),
    Case("cli unknown model-config key", lambda c: c.cli(
        "predict", c.write_image("a.png"), "--model-config", '{"hiden_size": 8}'),
        CommandFailed, "--model-config: unknown keys ['hiden_size']", "none"),
    Case("cli model-config not an object", lambda c: c.cli(
        "train", "--model-config", "[1]", "--dataset", "cifar10", "--output", c.tmp / "r"),
        SystemExit, "", "files"),
    Case("cli corrupt weights file", lambda c: c.cli(
        "predict", c.write_image("a.png"), "--weights", c.write_npz(
            "bad.npz", cls=np.full((1, 1, 8), np.nan, np.float32))),
        CommandFailed, "cls: 8 non-finite values", "none"),
    Case("cli top-k 0", lambda c: c.cli("predict", "x.png", "--top-k", "0"), SystemExit, "",
         "files"),
    Case("cli class names of the wrong count", lambda c: c.cli(
        "predict", c.write_image("a.png"), "--weights", c.good, "--class-names",
        class_names_file(c, b"cat\ndog\n")), CommandFailed, "has 2 names but the model has 3",
        "none"),
    Case("cli evaluate weights of other classes", lambda c: c.cli(
        "evaluate", "--folder", c.folder(classes=2), "--weights", c.good, "--batch-size", "2"),
        CommandFailed, "has a head of 3 classes, but the data has 2 classes", "none"),
    Case("cli pretrain a missing folder", lambda c: c.cli(
        "pretrain", "--folder", c.tmp / "nothing", "--model-config", TINY_JSON,
        "--output", c.tmp / "run"), CommandFailed, "does not exist", "files"),
    Case("cli pretrain without an architecture", lambda c: c.cli(
        "pretrain", "--folder", c.tmp / "nothing", "--output", c.tmp / "run"), CommandFailed,
        "Give --model", "files"),
    Case("cli train one class", lambda c: c.cli(
        "train", "--folder", c.folder(classes=1), "--model-config", TINY_JSON,
        "--output", c.tmp / "run"), CommandFailed, "a classifier needs at least 2", "none"),
    Case("cli train a corrupt image", lambda c: c.cli(  # 10 images, 2 batches of 5: all seen
        "train", "--folder", c.folder(per_class=3, corrupt=["class0/bad.png"]), "--model-config",
        TINY_JSON, "--image-size", "16", "--batch-size", "5", "--epochs", "1", "--no-xla",
        "--validation-split", "none", "--verbose", "0", "--output", c.tmp / "run"),
        CommandFailed, "class0/bad.png", "none"),
    Case("cli train diverges", lambda c: c.cli(
        "train", "--folder", c.folder(), "--model-config", TINY_JSON, "--image-size", "16",
        "--batch-size", "4", "--epochs", "2", "--lr", "1e30", "--no-xla",
        "--validation-split", "none", "--verbose", "0", "--output", c.tmp / "run", status=1),
        CommandFailed, "Training diverged", "none"),
    Case("cli fewshot tested on its own shots", lambda c: c.cli(
        "fewshot", "--folder", c.folder(), "--weights", c.good, "--split", "train"),
        CommandFailed, "overlaps --train-split train", "none"),
    Case("cli convert to an unknown format", lambda c: c.cli("convert", c.good, c.tmp / "m.onnx"),
         CommandFailed, "OUT must end in .keras, .weights.h5, .npz", "files"),
    Case("cli export TFLite flags to a SavedModel", lambda c: c.cli(
        "export", c.tmp / "e", "--weights", c.good, "--quantize", "dynamic-int8"),
        CommandFailed, "--quantize does not apply to --format saved_model", "files"),
    Case("cli inspect a missing image", lambda c: c.cli(
        "inspect", c.tmp / "no.png", "--out", c.tmp / "figs", "--weights", c.good),
        CommandFailed, "no.png does not exist", "files"),
    Case("cli weights default with a .keras file", lambda c: c.cli(
        "predict", c.write_image("a.png"), "--model", "m.keras", "--weights", "default"),
        CommandFailed, "needs a variant --model", "none"),
    Case("cli tfds not prepared, offline", lambda c: c.cli(
        "train", "--dataset", "cifar10", "--model-config", TINY_JSON, "--data-dir",
        c.tmp / "tfds", "--output", c.tmp / "run"), CommandFailed,
        "cifar10 is not prepared", "none"),
]


@pytest.fixture
def ctx(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(weights.registry, "_REGISTERED", {})
    monkeypatch.setattr(data, "_online", lambda: False)  # never download in a test
    return Context(tmp_path, capsys)


def test_the_table_covers_sixty_cases():
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, ctx):
    before = ctx.files()
    with pytest.raises(case.error) as info:
        case.action(ctx)
    message = str(info.value)
    assert case.phrase in message, message
    if case.error is SystemExit:
        assert info.value.code == 2  # argparse's usage error
    else:
        assert "\nTraceback" not in message
    if case.unchanged == "model":
        ctx.model_unchanged()
    elif case.unchanged == "files":
        assert ctx.files() == before
    if hasattr(ctx, "run_files"):  # a finished run keeps its results
        assert ctx.files(ctx.tmp / "run") == ctx.run_files
    if hasattr(ctx, "export_files"):  # the existing export is untouched
        assert ctx.files(ctx.tmp / "e") == ctx.export_files
    if case.name == "diverged run":  # no NaN weights written as final or best
        assert not (ctx.tmp / "run" / "final.npz").exists()
        best = ctx.tmp / "run" / "best.npz"
        assert not best.exists() or all(np.isfinite(v).all()
                                        for v in weights.read_npz(best).values())


def test_downloads_stay_in_the_cache_and_follow_the_umask(ctx, tmp_path):
    source = tmp_path / "w.npz"
    weights.save_npz(ctx.model, source)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    keras_vit.register_checkpoint("odd/x_y+z-1.0", source.as_uri(), sha256=digest.upper())
    keras_vit.load_pretrained(keras_vit.ViT(**TINY), "odd/x_y+z-1.0", progress=False)
    cache = (tmp_path / "cache").resolve()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(cache) or p in (source, ctx.good) for p in written)
    assert [p for p in cache.rglob("*.npz")]
    cached = next(cache.rglob("*.npz"))
    assert cached == cache / "odd" / "x_y+z-1.0.npz"
    umask = keras_vit.fileio.current_umask()
    assert os.stat(cached).st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_best_checkpoint_survives_a_resume(ctx, tmp_path):
    """The resumed run's first epoch replaces best.npz only if it is better."""
    model = keras_vit.ViT(**TINY)
    callback = training.BestCheckpoint(tmp_path / "best.npz", monitor="loss")
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0, {"loss": 0.5})
    saved = (tmp_path / "best.npz").read_bytes()
    resumed = training.BestCheckpoint(tmp_path / "best.npz", monitor="loss")
    resumed.set_model(keras_vit.ViT(**TINY))
    resumed.on_train_begin()
    assert resumed.best == 0.5
    resumed.on_epoch_end(1, {"loss": 0.9})  # worse: kept
    assert (tmp_path / "best.npz").read_bytes() == saved
    resumed.on_epoch_end(2, {"loss": 0.1})  # better: replaced
    assert (tmp_path / "best.npz").read_bytes() != saved


def test_a_diverged_run_keeps_its_last_finite_backup(ctx, tmp_path):
    class Poison(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                head = self.model.get_layer("head")
                head.kernel.assign(np.full(head.kernel.shape, np.nan, np.float32))

    with pytest.raises(training.TrainingDiverged, match="--overwrite or a new --output"):
        fit_tiny(ctx, tmp_path / "run", epochs=4, callbacks=[Poison()])
    backup = pathlib.Path(training.backup_dir(tmp_path / "run"))
    assert training.resume_epoch(backup) == 2  # the epochs before the NaN, not the NaN one
    model = keras_vit.ViT(**TINY)
    model.load_weights(backup / json.loads((backup / "latest.json").read_text())["dir"]
                       / "model.weights.h5", skip_mismatch=True)
    assert all(np.isfinite(v).all() for v in weights.model_params(model).values())


def test_a_file_url_is_fetched_again_when_the_file_changes(ctx, tmp_path):
    source = tmp_path / "mine.npz"
    weights.save_npz(ctx.model, source)
    keras_vit.register_checkpoint("mine/run", source.as_uri())
    first = keras_vit.ViT(**TINY)
    keras_vit.load_pretrained(first, "mine/run", progress=False)
    retrained = keras_vit.ViT(**TINY)
    retrained.get_layer("head").kernel.assign(np.ones((8, 3), np.float32))
    weights.save_npz(retrained, source)
    os.utime(source, (os.path.getatime(source), os.path.getmtime(source) + 10))
    second = keras_vit.ViT(**TINY)
    keras_vit.load_pretrained(second, "mine/run", progress=False)
    np.testing.assert_array_equal(second.get_layer("head").kernel.numpy(), np.ones((8, 3)))


def test_bfloat16_safetensors_load_as_their_float32_values(ctx):
    import ml_dtypes

    path = timm_file(ctx)
    from safetensors.numpy import load_file, save_file

    params = {k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(path).items()}
    save_file(params, str(path))
    model = keras_vit.ViT(**TINY)
    keras_vit.load_pretrained(model, str(path))
    for key, value in weights.model_params(model).items():
        want = weights.torch_layouts.from_timm(
            {k: v.astype(np.float32) for k, v in params.items()}, num_heads=2)[key]
        np.testing.assert_array_equal(value, want, err_msg=key)


def test_timm_architecture_names_outside_the_paper_table_give_their_heads():
    from keras_vit.weights import hub

    assert hub._config_heads({"architecture": "vit_small_patch8_224"}, "timm") == 6
    assert hub._config_heads({"architecture": "vit_huge_patch14_clip_224"}, "timm") == 16
    assert hub._config_heads({"architecture": "deit_base"}, "timm") is None


def test_corrupt_images_are_named_and_can_be_skipped(ctx, capsys):
    root = ctx.folder(corrupt=["class1/bad.png"])
    bad = data.find_corrupt_images(data.list_image_folder(root)[0])
    assert [pathlib.Path(p).name for p, _ in bad] == ["bad.png"]
    pipeline = data.from_folder(root, image_size=8, batch_size=4, training=True,
                                skip_corrupt=True)
    assert pipeline.num_examples == 12 and len(pipeline.skipped) == 1
    assert "skipped 1 of 13 files" in capsys.readouterr().err
    next(iter(pipeline.dataset))  # the rest decodes


def test_float_images_in_unit_range_are_scaled(ctx):
    x = np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)).astype(np.float32)
    unit = data.from_arrays(x, np.arange(4) % 2, image_size=8, batch_size=4, training=False,
                            value_range=(0, 1))
    full = data.from_arrays(x * 255, np.arange(4) % 2, image_size=8, batch_size=4,
                            training=False, value_range=(0, 255))
    np.testing.assert_allclose(next(iter(unit.dataset))[0], next(iter(full.dataset))[0],
                               atol=1e-5)


def test_inspection_of_a_one_block_model(ctx, tmp_path):
    model = keras_vit.ViT(**TINY)
    figures = keras_vit.inspect_model(model, np.zeros((2, 16, 16, 3), np.float32), tmp_path)
    assert figures["attention_distance"][1].shape == (1, 2)


def test_predict_uses_the_class_names_training_wrote(ctx, tmp_path, capsys):
    fit_tiny(ctx, tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["class_names"] = ["cat", "dog", "bird"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    assert cli.main(["predict", str(ctx.write_image("a.png")), "--weights",
                     str(tmp_path / "run" / "final.npz"), "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("cat", "dog", "bird"))


SUBPROCESS_CASES = [
    (["predict", "missing.jpg", "--model", "B/16"], 2, "missing.jpg does not exist"),
    (["predict", "x.png", "--model-config", '{"hiden": 1}'], 2, "unknown keys ['hiden']"),
    (["convert", "nothing.npz", "out.keras"], 2, "No checkpoint file at nothing.npz"),
    (["export", "out", "--model", "B/16", "--weights", "imagenet21k/ViT-B_17"], 2,
     "Unknown checkpoint 'imagenet21k/ViT-B_17'. Did you mean"),
]


@pytest.mark.parametrize("argv, status, phrase", SUBPROCESS_CASES)
def test_command_line_errors_in_a_real_process(argv, status, phrase, tmp_path):
    result = subprocess.run([sys.executable, "-m", "keras_vit", *argv], capture_output=True,
                            text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == status, result.stderr[-2000:]
    assert phrase in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written
