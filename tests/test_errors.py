"""Bad input and faults, as a table: every case names the input, the error it must raise, a phrase
its one-line message must contain, and what must be unchanged afterwards (model weights, files,
caches, exports, backups), with a check of its own where it needs one. The command line's cases
assert exit status 2 (1 for a diverged run) and no traceback; a few run in a real subprocess.
The faults that need processes of their own (two runs at once, kill -9, a full disk in each
kind of write) are in tests/test_faults.py."""

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

import keras_vit
import keras_vit_cli as cli
from keras_vit import data, export, fileio, images, labels, training, vtab, weights
from keras_vit.parallel import keras_distribution
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
        self._model = keras_vit.ViT(**TINY)
        self.model_before = weights.model_params(self._model)
        self.good = tmp_path / "good.npz"
        weights.save_npz(self._model, self.good)
        self.model_used = False

    @property
    def model(self):
        """The tiny model a case may load into, train, export or quantize (noted as used)."""
        self.model_used = True
        return self._model

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
        assert self.model_used, ("the case never uses the context's model, so the check cannot "
                                 "fail: declare unchanged='files' or 'none'")
        after = weights.model_params(self._model)
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
    # What must be unchanged: "model" (the context's model, which the case uses), "files"
    # (nothing under tmp written or changed) or "none".
    unchanged: str = "model"
    after: object = None  # Context -> None: a check of its own, once the error is raised


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


def fit_tiny(ctx, output, lr=0.01, epochs=2, class_names=None, model=None,  # noqa: ARG001
             **kwargs):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8)
    y = np.arange(12) % 3
    train = data.from_arrays(x, y, num_classes=3, image_size=16, batch_size=4, training=True,
                             class_names=class_names)
    model = model or keras_vit.ViT(**TINY)
    return training.fit(model, train, kwargs.pop("validation", None), output_dir=output,
                        epochs=epochs, learning_rate=lr, verbose=0, jit_compile=False, **kwargs)


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


def renamed_validation_run(ctx):
    """Validation images whose class folders sort otherwise: label 0 is another class."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    validation = data.from_arrays(x, np.arange(6) % 3, image_size=16, batch_size=3,
                                  training=False, class_names=["cat", "bird", "dog"])
    fit_tiny(ctx, ctx.tmp / "run", class_names=["bird", "cat", "dog"], validation=validation)


def rebuilt_model_run(ctx):
    """A run stopped after its first epoch, resumed with a wider model: its backup holds the
    first model's weights, and its config.json must keep describing them."""
    output = ctx.tmp / "run"
    fit_tiny(ctx, output, epochs=1)
    os.makedirs(training.backup_dir(output), exist_ok=True)
    record = json.loads((output / "run.json").read_text())
    (output / "run.json").write_text(json.dumps(dict(record, finished=False)))
    ctx.run_files = ctx.files(output)
    fit_tiny(ctx, output, epochs=1, model=keras_vit.ViT(**dict(TINY, hidden_size=16)))


def renamed_classes_run(ctx):
    """A run stopped after its first epoch, resumed on the same images with class folder
    "bird" renamed "fish": label 0 would now mean "cat" to the head trained with it as "bird"."""
    output = ctx.tmp / "run"
    fit_tiny(ctx, output, epochs=1, class_names=["bird", "cat", "dog"])
    os.makedirs(training.backup_dir(output), exist_ok=True)
    record = json.loads((output / "run.json").read_text())
    (output / "run.json").write_text(json.dumps(dict(record, finished=False)))
    fit_tiny(ctx, output, epochs=1, class_names=["cat", "dog", "fish"])


def unfinished_run(ctx):
    """A run folder as a run killed after its first backup leaves it (run.json unfinished), its
    backup folder still to be written by the case."""
    output = ctx.tmp / "run"
    fit_tiny(ctx, output)
    record = json.loads((output / "run.json").read_text())
    (output / "run.json").write_text(json.dumps(dict(record, finished=False)))
    return pathlib.Path(training.backup_dir(output))


def corrupt_pointer(ctx):
    backup = unfinished_run(ctx)
    backup.mkdir(parents=True)
    (backup / "latest.json").write_text('{"epoch": "one"')
    fit_tiny(ctx, ctx.tmp / "run")


def corrupt_backup(ctx):
    backup = unfinished_run(ctx)
    (backup / "epoch-000001").mkdir(parents=True)
    (backup / "epoch-000001" / "state.npz").write_bytes(b"not a zip")
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

    params = torch_layouts.to_timm(ctx.params())
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


HUB_FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "hub"


def timm_config(ctx, root=None, **model_args):
    """A timm file of the context's model, beside a config.json as timm writes it with
    `model_args` (and top-level keys `root`) changed."""
    path = timm_file(ctx)
    config = json.loads((ctx.tmp / "config.json").read_text())
    config["model_args"] = model_args.pop("replace", None) or dict(
        config["model_args"], **model_args)
    config.update(root or {})
    (ctx.tmp / "config.json").write_text(json.dumps(config))
    return path


def transformers_config(ctx, **changes):
    """transformers' own fixture file, beside its config.json with `changes`."""
    folder = ctx.tmp / "hf"
    shutil.copytree(HUB_FIXTURES / "transformers_vit", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, **changes)))
    return folder / "model.safetensors"


def from_file(path_fn):
    return lambda ctx: keras_vit.from_pretrained(path_fn(ctx))


def sidecar(ctx, **model_changes):
    """A training run's final.npz, beside its config.json with `model` changed."""
    fit_tiny(ctx, ctx.tmp / "run", epochs=1)
    path = ctx.tmp / "run" / "config.json"
    config = json.loads(path.read_text())
    config["model"] = model_changes.pop("replace", None) or dict(config["model"],
                                                                 **model_changes)
    path.write_text(json.dumps(config))
    return ctx.tmp / "run" / "final.npz"


class StopAfter(keras.callbacks.Callback):
    """Stops a run, as a crash would, once `epochs` epochs have finished (and been backed up)."""

    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            raise KeyboardInterrupt


def interrupted_run(ctx, tamper):
    """A run that keeps best.npz, stopped after its first epoch; `tamper(run folder)`, then
    the same run again."""
    run = ctx.tmp / "run"
    with contextlib.suppress(KeyboardInterrupt):
        fit_tiny(ctx, run, epochs=3, monitor="loss", callbacks=[StopAfter(1)])
    tamper(run)
    ctx.run_files = ctx.files(run)
    fit_tiny(ctx, run, epochs=3, monitor="loss")


def locked_run(ctx):
    """A training run on a folder a VTAB run holds."""
    (ctx.tmp / "run").mkdir()
    with fileio.folder_lock(ctx.tmp / "run", "VTAB run"):
        fit_tiny(ctx, ctx.tmp / "run")


def locked_vtab(ctx):
    """A VTAB run on a folder a training run holds."""
    (ctx.tmp / "vtab").mkdir()
    with fileio.folder_lock(ctx.tmp / "vtab"), tfds.testing.mock_data(num_examples=8):
        vtab.run(vtab_model, ctx.tmp / "vtab", tasks="dtd", steps=4, batch_size=4,
                 jit_compile=False, verbose=0)


@contextlib.contextmanager
def file_size_limit(limit):
    """This process's file-size limit (`ulimit -f`), for the block: a write past it fails with
    EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def on_a_full_disk(action):
    def run(ctx):
        with file_size_limit(1000):
            action(ctx)
    return run


def flat_folder_with_a_corrupt_image(ctx):
    for i in range(8):
        ctx.write_image(f"flat/{i}.png", size=(16, 16))
    ctx.write_image("flat/bad.jpg", data=b"\xff\xd8\xff\xe0 not a JPEG")
    return ctx.tmp / "flat"


def vtab_model(num_classes):
    return keras_vit.ViT(**dict(TINY, num_classes=num_classes))


def tampered_vtab(ctx, tamper):
    """A finished one-task VTAB suite, `tamper(its folder)`, then extended by a task: refused
    before the new task is trained."""
    out = ctx.run_dir = ctx.tmp / "vtab"
    settings = dict(steps=4, batch_size=4, jit_compile=False, verbose=0)
    trained = []

    def model_fn(num_classes):
        trained.append(num_classes)
        return vtab_model(num_classes)

    with tfds.testing.mock_data(num_examples=8):
        vtab.run(model_fn, out, tasks="dtd", **settings)
        tamper(out)
        ctx.run_files = ctx.files(out)
        try:
            vtab.run(model_fn, out, tasks="dtd,eurosat", **settings)
        finally:
            assert trained == [47]  # eurosat was not trained


def results_cell(column, value):
    """A tampering of a VTAB folder: `value` in `column` of results.csv's first row."""
    def tamper(out):
        rows = (out / "results.csv").read_text().splitlines()
        cells = rows[1].split(",")
        cells[rows[0].split(",").index(column)] = value
        (out / "results.csv").write_text("\n".join([rows[0], ",".join(cells)]) + "\n")
    return tamper


def new_output_after_a_usage_error(ctx):
    ctx.cli("train", "--folder", ctx.folder(), "--model-config",
            json.dumps(dict(json.loads(TINY_JSON), hidden_size=9)), "--image-size", "16",
            "--output", ctx.tmp / "new" / "run")


def no_folder(*parts):
    def check(ctx):
        assert not (ctx.tmp.joinpath(*parts)).exists()
    return check


def dynamic_model(**changes):
    return keras_vit.ViT(**dict(TINY, dynamic_image_size=True, **changes))


def exported_dynamic_model_fed(ctx, images):
    """The `predict_images` signature of an exported model of any input size, on `images`."""
    path = export.export_saved_model(dynamic_model(), ctx.tmp / "e", warmup=False)
    signature = tf.saved_model.load(path).signatures[export.IMAGES_SIGNATURE]
    signature(images=tf.constant(images, tf.float32))


def trained_head_model():
    model = keras_vit.ViT(**TINY)
    model.get_layer("head").bias.assign(np.array([0.1, 0.0, -0.1], np.float32))
    return model


def tiny_model_fn(num_classes):
    return keras_vit.ViT(**dict(TINY, num_classes=num_classes))


# The arguments of the from_tf_dataset cases.
TF_DATASET = dict(num_classes=3, image_size=8, batch_size=4, training=False)

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
    Case("registered file missing", lambda c: [
        keras_vit.register_checkpoint("mine/gone", (c.tmp / "gone.npz").as_uri()),
        keras_vit.load_pretrained(c.model, "mine/gone", progress=False)], weights.DownloadError,
        "gone.npz: [Errno 2] No such file or directory"),
    # -- Model arguments. ------------------------------------------------------------------------
    Case("gelu_approximate a string", lambda c: keras_vit.ViT(gelu_approximate="no"), ValueError,
         "`gelu_approximate` must be True or False. Received: gelu_approximate='no'", "files"),
    Case("include_top a string", lambda c: keras_vit.ViT(include_top="yes"), ValueError,
         "`include_top` must be True or False", "files"),
    Case("dropout_rate None", lambda c: keras_vit.ViT(dropout_rate=None), ValueError,
         "`dropout_rate` must be a number in [0, 1). Received: dropout_rate=None", "files"),
    Case("dropout_rate above 1", lambda c: keras_vit.ViT(dropout_rate=2.5), ValueError,
         "`dropout_rate` must be a number in [0, 1). Received: dropout_rate=2.5", "files"),
    Case("an epsilon beyond a float's range", lambda c: keras_vit.ViT(
        layer_norm_epsilon=10**400), ValueError, "`layer_norm_epsilon` must be a number in "
         "(0, inf)", "files"),
    Case("an integer dtype policy", lambda c: keras_vit.ViT(dtype="int32"), ValueError,
         "dtype='int32' is not a floating-point dtype policy. Expected one of 'float32'",
         "files"),
    Case("zero layers", lambda c: keras_vit.ViT(num_layers=0), ValueError,
         "`num_layers` must be a positive integer", "files"),
    Case("heads do not divide width", lambda c: keras_vit.ViT(hidden_size=100, num_heads=12),
         ValueError, "hidden_size 100 is not divisible by num_heads 12", "files"),
    Case("image not divisible by patch", lambda c: keras_vit.ViT(image_size=225), ValueError,
         "image_size height 225 is not divisible by patch_size 16", "files"),
    Case("dropout of 1.5", lambda c: keras_vit.TransformerBlock(2, 8, dropout_rate=1.5),
         ValueError, "`dropout_rate` must be a number in [0, 1)", "files"),
    Case("NaN epsilon", lambda c: keras_vit.TransformerBlock(2, 8, layer_norm_epsilon=float("nan")),
         ValueError, "`layer_norm_epsilon` must be a number in (0, inf)", "files"),
    Case("unknown variant", lambda c: keras_vit.create_model("B/15"), ValueError,
         "Unknown ViT variant 'B/15'", "files"),
    # -- Data. --------------------------------------------------------------------------------
    Case("float images without their range", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.float32), np.arange(4) % 2, image_size=8, batch_size=2,
        training=False), ValueError, "say their range with value_range=(0, 255)", "files"),
    Case("float images outside their range", lambda c: data.from_arrays(
        np.full((4, 8, 8, 3), 200.0), np.arange(4) % 2, image_size=8, batch_size=2,
        training=False, value_range=(0, 1)), ValueError, "from 200 to 200, outside [0, 1]", "files"),
    Case("float images in [0, 1] declared [0, 255]", lambda c: data.from_arrays(
        np.full((4, 8, 8, 3), 0.5, np.float32), np.arange(4) % 2, image_size=8, batch_size=2,
        training=False, value_range=(0, 255)), ValueError,
        "scaled to [0, 1], not [0, 255]. Expected value_range=(0, 1)", "files"),
    Case("more class names than classes", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2, num_classes=2,
        class_names=["a", "b", "c"], image_size=8, batch_size=2, training=False), ValueError,
        "class_names has 3 names but the data has 2 classes", "files"),
    Case("class names as one string", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2, class_names="ab", image_size=8,
        batch_size=2, training=False), ValueError, "class_names must be a list of str", "files"),
    Case("a seed beyond int64", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2, seed=2**70, image_size=8,
        batch_size=2, training=True), ValueError, "`seed` must be an integer in [0, 2**63)",
        "files"),
    Case("an inverted crop area range", lambda c: data.from_arrays(
        np.zeros((4, 8, 8, 3), np.uint8), np.arange(4) % 2, augment={"area_range": (0.9, 0.1)},
        image_size=8, batch_size=2, training=True), ValueError,
        "`augment['area_range']` must be (low, high) with 0 < low <= high <= 1", "files"),
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
    # Diverged in its first epoch: no final weights, and no folder left (nothing to resume).
    Case("diverged run", lambda c: fit_tiny(c, c.tmp / "run", lr=1e30), training.TrainingDiverged,
         "no epoch was kept (no backup, no best.npz)", "none", after=no_folder("run")),
    Case("finished run run again", finished_run, training.RunFinished, "finished (2 epochs)",
         "none"),
    Case("resumed with other settings", changed_run, ValueError,
         "was started with other settings (epochs 1 -> 3", "none"),
    Case("validation classes named otherwise", renamed_validation_run, ValueError,
         "The validation data names its classes otherwise than the training data (class_names:"
         " label 0 'bird' -> 'cat', label 1 'cat' -> 'bird' (2 of 3 differ))", "files"),
    Case("resumed with another model", rebuilt_model_run, ValueError,
         "was started with other settings (model.hidden_size 8 -> 16)", "none"),
    Case("resumed with renamed classes", renamed_classes_run, ValueError,
         "other settings (class_names: label 0 'bird' -> 'cat', label 1 'cat' -> 'dog', label "
         "2 'dog' -> 'fish' (3 of 3 differ))",
         "none"),
    Case("corrupt backup pointer", corrupt_pointer, training.BackupError,
         "backup pointer", "none"),
    Case("corrupt backup weights", corrupt_backup, training.BackupError, "cannot be restored",
         "none"),
    Case("epochs and steps both", lambda c: training.fit(
        c.model, data.from_arrays(np.zeros((4, 16, 16, 3), np.uint8), np.arange(4) % 2,
                                  image_size=16, batch_size=2, training=True),
        output_dir=c.tmp / "run", epochs=1, steps=2), ValueError,
        "Give exactly one of `epochs` and `steps`"),
    *(Case(f"fit with {name}", lambda c, given=given: training.fit(
        c.model, data.from_arrays(np.zeros((4, 16, 16, 3), np.uint8), np.arange(4) % 2,
                                  image_size=16, batch_size=2, training=True),
        **dict(dict(output_dir=c.tmp / "run", epochs=1), **given)), error, message)
      for name, given, error, message in (
          # Each at the call, before the run starts: 0 is no batch size to accumulate to.
          ("target_batch_size 0", dict(target_batch_size=0), ValueError,
           "`target_batch_size` must be a positive integer"),
          ("callbacks not a list of callbacks", dict(callbacks=5), TypeError,
           "`callbacks` must be a list of keras.callbacks.Callback. Received: 5"),
          ("output_dir None", dict(output_dir=None), TypeError,
           "`output_dir` must be a folder's path"),
          # Beyond float32's range, where the optimizer computes: infinite there.
          ("learning_rate beyond float32", dict(learning_rate=1e308), ValueError,
           "`learning_rate` must be a number in (0, 3.40282e+38]"),
          ("weight_decay beyond float32", dict(recipe="pretrain", weight_decay=1e308),
           ValueError, "`weight_decay` must be a number in [0, 3.40282e+38]"))),
    Case("a model called on grey images of one channel",  # past Keras' input check
         lambda c: c.model(np.zeros((2, TINY["image_size"], TINY["image_size"], 1), np.float32)),
         ValueError, "PatchEmbedding takes images of 3 channels. Received 1", "files"),
    Case("patch-embedding components of gray='yes'", lambda c: keras_vit.inspection.
         patch_embedding_components(c.model, gray="yes"), ValueError,
         "`gray` must be True or False. Received: gray='yes'", "files"),
    Case("few-shot of one class", lambda c: keras_vit.evaluation.fewshot_table(
        np.ones((4, 8)), np.zeros(4, int), np.ones((2, 8)), np.zeros(2, int), shots=(1,)),
         ValueError, "a classifier needs at least 2", "files"),
    Case("warm-up longer than the run", lambda c: training.WarmupDecay(0.1, 10, 10),
         ValueError, "warmup_steps 10 must be smaller than total_steps 10", "files"),
    Case("accumulation not a divisor", lambda c: training.accumulation_steps(100, 64),
         ValueError, "target_batch_size 100 is not a multiple of batch_size 64", "files"),
    Case("output folder is a file", lambda c: training.training_callbacks(
        c.write_image("f.png") / "run"), ValueError, "is not writable", "none"),
    Case("overwrite with bad arguments", overwrite_with_bad_arguments, ValueError,
         "`learning_rate` must be a number in (0, 3.40282e+38]", "none"),
    # -- Weights in other layouts. -------------------------------------------------------------
    Case("timm file with an array ViT has no place for", load(lambda c: timm_file(
        c, **{"norm_pre.bias": np.zeros(8, np.float32)})), CheckpointError,
        "has arrays keras_vit's ViT has no place for: norm_pre.bias"),
    Case("timm file without the patch bias", load(lambda c: timm_file(
        c, **{"patch_embed.proj.bias": None})), CheckpointError,
        "The timm checkpoint has no 'patch_embed.proj.bias'"),
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
    # -- Reliability III (issue 27), item by item. ----------------------------------------------
    # 1. One writer per run folder (two processes: tests/test_faults.py).
    Case("a run on a folder a VTAB run holds", locked_run, fileio.FolderInUse,
         f"is in use by another VTAB run: process {os.getpid()} on ", "none"),
    Case("a VTAB run on a folder a training run holds", locked_vtab, fileio.FolderInUse,
         f"is in use by another run: process {os.getpid()} on ", "none"),
    # 2. A full disk is one line naming the file; nothing half-written (backups, exports and
    # the rest: tests/test_faults.py).
    Case("a checkpoint written over an existing file", lambda c: weights.save_npz(
        c.model, c.good), fileio.DestinationExists, "good.npz already exists. Nothing was written",
        "files"),
    Case("a checkpoint written to a full disk", on_a_full_disk(
        lambda c: weights.save_npz(c.model, c.tmp / "full.npz")), fileio.WriteError,
        "full.npz: File too large", "files"),
    # 4. An int8 model's .npz holds its float weights (tests/test_roundtrip.py); the int8
    # model itself takes no float checkpoint.
    Case("a checkpoint loaded into an int8 model", lambda c: [
        c.model.quantize("int8"), keras_vit.load_pretrained(c.model, str(c.good))],
        CheckpointError, "is int8-quantized", "none"),
    # 5. A fresh head is refused unless asked for.
    Case("evaluate a fresh head", lambda c: keras_vit.evaluate(
        c.model, (np.zeros((4, 16, 16, 3), np.uint8), np.arange(4) % 3)), ValueError,
        "has a fresh head (all zeros", "model"),
    Case("cli evaluate without weights", lambda c: c.cli(
        "evaluate", "--folder", c.folder(), "--model-config", TINY_JSON, "--image-size", "16",
        "--batch-size", "4"), CommandFailed, "--allow-fresh-head", "none"),
    # 6. Arrays of float images say their range, as data.from_arrays takes them.
    Case("evaluate float images without their range", lambda c: keras_vit.evaluate(
        trained_head_model(), (np.full((4, 16, 16, 3), 0.5, np.float32), np.arange(4) % 3)),
        ValueError, "say their range with value_range=(0, 255) or value_range=(0, 1)", "files"),
    # 6b. What evaluate and the few-shot fit take is checked before any answer: labels of
    # keras.datasets' shape [N, 1] broadcast against the predictions ([N, N] comparisons).
    Case("evaluate labels of shape [N, 1]", lambda c: keras_vit.evaluate(
        trained_head_model(), (np.zeros((4, 16, 16, 3), np.uint8), (np.arange(4) % 3)[:, None]),
        progress=False), ValueError, "shape (4, 1) for 4 images: expected one class id per "
        "image, shape (4,) (keras.datasets gives [N, 1] labels: labels.reshape(-1))", "files"),
    Case("evaluate a dataset of [N, 1] labels", lambda c: keras_vit.evaluate(
        trained_head_model(), tf.data.Dataset.from_tensor_slices((
            np.zeros((4, 16, 16, 3), np.float32), (np.arange(4) % 3)[:, None])).batch(2),
        progress=False), ValueError, "The dataset's labels have shape (2, 1)", "files"),
    Case("evaluate a dataset of raw uint8 pixels", lambda c: keras_vit.evaluate(
        trained_head_model(), tf.data.Dataset.from_tensor_slices((
            np.full((4, 16, 16, 3), 200, np.uint8), np.arange(4) % 3)).batch(2),
        progress=False), ValueError, "The dataset's images are uint8, not scaled", "files"),
    Case("extract_features of a dataset of float pixels in [0, 255]", lambda c: (
        keras_vit.extract_features(trained_head_model(), tf.data.Dataset.from_tensor_slices((
            np.linspace(0, 255, 4 * 16 * 16 * 3, dtype=np.float32).reshape(4, 16, 16, 3),
            np.arange(4) % 3)).batch(2), progress=False)), ValueError,
        "hold values from 0 to 127.4585; the model's preprocessing (model.data_config) gives "
        "[-1, 1]", "files"),
    Case("evaluate an unbatched dataset", lambda c: keras_vit.evaluate(
        trained_head_model(), tf.data.Dataset.from_tensor_slices((
            np.zeros((4, 16, 16, 3), np.float32), np.arange(4) % 3)), progress=False),
        ValueError, "have shape (16, 16, 3): expected a batch of RGB images [batch, height, "
        "width, 3] (a dataset of single images: dataset.batch(n))", "files"),
    Case("evaluate images of another size", lambda c: keras_vit.evaluate(
        trained_head_model(), (np.zeros((4, 32, 32, 3), np.uint8), np.arange(4) % 3),
        progress=False), ValueError, "are 32x32 pixels; the model takes 16x16", "files"),
    Case("evaluate batch_size 0", lambda c: keras_vit.evaluate(
        trained_head_model(), (np.zeros((4, 16, 16, 3), np.uint8), np.arange(4) % 3),
        batch_size=0, progress=False), ValueError, "`batch_size` must be a positive integer",
        "files"),
    Case("fewshot_table labels of shape [N, 1]", lambda c: keras_vit.fewshot_table(
        np.eye(6), (np.arange(6) % 2)[:, None], np.eye(6), np.arange(6) % 2, shots=(1,)),
        ValueError, "The train labels have shape (6, 1) for 6 rows of features", "files"),
    Case("fewshot_table features of two widths", lambda c: keras_vit.fewshot_table(
        np.eye(6), np.arange(6) % 2, np.eye(6)[:, :4], np.arange(6) % 2, shots=(1,)),
        ValueError, "The train features are 6 wide, the test features 4", "files"),
    Case("preprocess_inputs of None", lambda c: keras_vit.preprocess_inputs(None),
         ValueError, "expects RGB images [..., height, width, 3], an array or tensor. "
         "Received: NoneType", "files"),
    Case("decode_predictions of NaN logits", lambda c: keras_vit.decode_predictions(
        np.array([[0.0, 1.0, 2.0], [np.nan, 1.0, 2.0]]), top=1, class_names=["a", "b", "c"]),
        ValueError, "the logits of 1 of 2 images give no probabilities (NaN, +inf, or every "
        "one -inf; the first: image 1)", "files"),
    Case("classify_images with its arguments swapped", lambda c: keras_vit.classify_images(
        ["a.png"], c.model), ValueError, "takes the model first, then the images", "files"),
    Case("classify_images of batches of 0", lambda c: keras_vit.classify_images(
        c.model, ["a.png"], batch_size=0), ValueError,
        "`batch_size` must be a positive integer. Received: batch_size=0", "files"),
    # 6c. The input pipelines refuse what they would read wrongly: float pixels taken as
    # [0, 255] (images in [0, 1] all near black), float labels truncated, labels beyond
    # num_classes, a "validation" subset of a folder that is not split (every image).
    Case("from_tf_dataset of float images", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.full((4, 8, 8, 3), 0.5, np.float32),
                                            np.arange(4) % 3)), **TF_DATASET),
        ValueError, "The dataset's images are float32: say their range with "
        "value_range=(0, 255)", "files"),
    Case("from_tf_dataset of float labels", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8, 3), np.uint8),
                                            np.arange(4) % 3 + 0.9)), **TF_DATASET),
        ValueError, "The dataset's labels must be integer class ids", "files"),
    Case("from_tf_dataset of labels beyond num_classes", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8, 3), np.uint8),
                                            np.arange(4) + 1)), **dict(TF_DATASET, training=True,
                                                                      batch_size=2)),
        ValueError, "The dataset's labels out of range: [3, 4]", "files"),
    Case("from_tf_dataset of a batched dataset", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8, 3), np.uint8),
                                            np.arange(4) % 3)).batch(2), **TF_DATASET),
        ValueError, "(a batched dataset: dataset.unbatch())", "files"),
    Case("from_tf_dataset of a repeated dataset", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8, 3), np.uint8),
                                            np.arange(4) % 3)).repeat(), **TF_DATASET),
        ValueError, "The dataset repeats forever", "files"),
    Case("from_tf_dataset with a decode giving floats", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.array([b"x"] * 4), np.arange(4) % 3)),
        decode=lambda raw: tf.fill([8, 8, 3], 0.5), **TF_DATASET), ValueError,
        "The images `decode` returns are float32: say their range with value_range=", "files"),
    Case("from_tf_dataset of no examples", lambda c: data.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices((np.zeros((0, 8, 8, 3), np.uint8),
                                            np.zeros(0, np.int64))), **TF_DATASET),
        ValueError, "The data holds no examples", "files"),
    Case("from_folder subset without a split", lambda c: data.from_folder(
        c.folder(), image_size=8, batch_size=2, training=False, subset="validation"),
        ValueError, "`subset` 'validation' needs a `validation_split` > 0", "none"),
    Case("from_folder split_seed None", lambda c: data.from_folder(
        c.folder(), image_size=8, batch_size=2, training=False, validation_split=0.5,
        subset="validation", split_seed=None), ValueError,
        "`split_seed` must be a non-negative integer", "none"),
    Case("from_folder holding out every image", lambda c: data.from_folder(
        c.folder(), image_size=8, batch_size=2, training=False, validation_split=0.99,
        subset="training"), ValueError, "holds out all 12 images", "none"),
    Case("from_folder training 'False'", lambda c: data.from_folder(
        c.folder(), image_size=8, batch_size=2, training="False"), ValueError,
        "`training` must be True or False. Received: training='False'", "none"),
    Case("from_arrays of images of no pixels", lambda c: data.from_arrays(
        np.zeros((4, 0, 8, 3), np.uint8), np.arange(4) % 3, image_size=8, batch_size=2,
        training=False), ValueError, "with H, W > 0. Received shape (4, 0, 8, 3)", "files"),
    Case("from_tfds of split None", lambda c: data.from_tfds(
        "cifar10", None, image_size=8, batch_size=2, training=False), ValueError,
        "`split` must be a split's name", "files"),
    # 6d. A VTAB run's settings are checked before its folder holds a record of them (one
    # that the corrected call would be refused by).
    Case("vtab sweep of a negative learning rate", lambda c: vtab.run(
        tiny_model_fn, c.tmp / "suite", tasks="dtd", sweep=[(-1.0, 2)]), ValueError,
        "`sweep learning rate` must be a number in (0, ", "none", after=no_folder("suite")),
    Case("vtab sweep of a setting twice", lambda c: vtab.run(
        tiny_model_fn, c.tmp / "suite", tasks="dtd", sweep=[(0.01, 2), (0.01, 2)]),
        ValueError, "`sweep` holds the setting (0.01, 2) twice", "none",
        after=no_folder("suite")),
    Case("vtab seed -1", lambda c: vtab.run(tiny_model_fn, c.tmp / "suite", tasks="dtd",
                                            seed=-1), ValueError,
         "`seed` must be a non-negative integer", "none", after=no_folder("suite")),
    Case("vtab seed 2**32", lambda c: vtab.run(tiny_model_fn, c.tmp / "suite", tasks="dtd",
                                               seed=2**32), ValueError,
         "`seed` must be an integer in [0, 4294967295]. Received: seed=4294967296", "none",
         after=no_folder("suite")),
    Case("from_pretrained of an encoder with num_classes and no include_top", lambda c: [
        weights.save_npz(keras_vit.ViT(**dict(TINY, include_top=False)), c.tmp / "enc.npz"),
        keras_vit.from_pretrained(c.tmp / "enc.npz", num_classes=4)], ValueError,
        "num_classes=4 asks for a head, but", "none"),
    # 7. A flat folder's undecodable image is named, and the failed run leaves nothing.
    Case("cli pretrain a flat folder with a corrupt image", lambda c: c.cli(
        "pretrain", "--folder", flat_folder_with_a_corrupt_image(c), "--model-config",
        TINY_JSON, "--image-size", "16", "--batch-size", "3", "--epochs", "1", "--no-xla",
        "--verbose", "0", "--output", c.tmp / "run"), CommandFailed, "flat/bad.jpg", "none",
        after=no_folder("run")),
    # 8. A missing manual folder is named before tensorflow-datasets writes anything.
    Case("vtab with a missing manual folder", lambda c: c.cli(
        "vtab", "--model-config", TINY_JSON, "--tasks", "diabetic_retinopathy",
        "--manual-dir", c.tmp / "nonexistent", "--data-dir", c.tmp / "tfds", "--output",
        c.tmp / "vtab"), CommandFailed, "--manual-dir) does not exist", "files",
        after=no_folder("tfds")),
    # 9. A config.json beside a .safetensors file is checked, field by field.
    Case("config.json model_args not an object", from_file(lambda c: timm_config(
        c, replace=[1])), CheckpointError, "`model_args` must be a JSON object", "none"),
    Case("config.json num_heads 3 of width 8", from_file(lambda c: timm_config(
        c, num_heads=3)), CheckpointError, "model_args.num_heads 3 does not fit the arrays",
        "none"),
    Case("config.json num_heads -2", from_file(lambda c: timm_config(c, num_heads=-2)),
         CheckpointError, "`model_args.num_heads` must be a positive integer", "none"),
    Case("config.json num_heads NaN", from_file(lambda c: timm_config(
        c, num_heads=float("nan"))), CheckpointError, "model_args.num_heads=nan", "none"),
    Case("config.json num_heads 2.5", from_file(lambda c: timm_config(c, num_heads=2.5)),
         CheckpointError, "model_args.num_heads=2.5", "none"),
    Case("config.json num_heads '2'", from_file(lambda c: timm_config(c, num_heads="2")),
         CheckpointError, "model_args.num_heads='2'", "none"),
    Case("config.json layer_norm_eps 'x'", from_file(lambda c: transformers_config(
        c, layer_norm_eps="x")), CheckpointError, "`layer_norm_eps` must be a number", "none"),
    # 10. ... and must agree with the arrays.
    Case("config.json depth contradicts the arrays", from_file(lambda c: timm_config(
        c, depth=12)), CheckpointError, "model_args.depth 12 contradicts the arrays of",
        "none"),
    Case("config.json num_hidden_layers contradicts the arrays", from_file(
        lambda c: transformers_config(c, num_hidden_layers=5)), CheckpointError,
        "num_hidden_layers 5 contradicts the arrays of", "none"),
    Case("config.json patch_size contradicts the arrays", from_file(lambda c: timm_config(
        c, patch_size=16)), CheckpointError, "model_args.patch_size [16, 16] contradicts",
        "none"),
    Case("config.json num_classes contradicts the head", from_file(lambda c: timm_config(
        c, root={"num_classes": 10})), CheckpointError, "num_classes 10 contradicts", "none"),
    Case("config.json global_pool map", from_file(lambda c: timm_config(
        c, global_pool="map")), CheckpointError, "must be one of 'token', 'avg'", "none"),
    Case("config.json model_type beit", from_file(lambda c: transformers_config(
        c, model_type="beit")), CheckpointError, "model_type 'beit' is not a ViT", "none"),
    Case("training config.json contradicts its checkpoint", from_file(lambda c: sidecar(
        c, hidden_size=16)), CheckpointError, "model.hidden_size 16 contradicts the arrays",
        "none"),
    Case("training config.json model not an object", from_file(lambda c: sidecar(
        c, replace=[1])), CheckpointError, "`model` must be a JSON object", "none"),
    # 11. best.npz is checked against the SHA-256 best.json records.
    Case("best.npz replaced before a resume", lambda c: interrupted_run(
        c, lambda run: (run / "best.npz").write_bytes(os.urandom(2000))),
        training.StateFileError, "best.npz is not the file", "none"),
    # 12. Corrupt state files are named, with the field.
    Case("best.json garbled", lambda c: interrupted_run(
        c, lambda run: (run / "best.json").write_text("{garbled")),
        training.StateFileError, "best.json is unreadable", "none"),
    Case("run.json not an object", lambda c: interrupted_run(
        c, lambda run: (run / "run.json").write_text("[1]")),
        training.StateFileError, "run.json holds list, expected a JSON object",
        "none"),
    Case("results.csv accuracy not a number", lambda c: tampered_vtab(
        c, results_cell("accuracy", "abc")), ValueError,
        "results.csv, line 2: accuracy 'abc' is not a non-negative number", "none"),
    Case("vtab.json settings not an object", lambda c: tampered_vtab(
        c, lambda out: (out / "vtab.json").write_text('{"settings": [1]}')),
        training.StateFileError, "vtab.json: field 'settings' is [1], expected an object",
        "none"),
    # 13. A model of any input size, given an empty image or one without its batch axis.
    Case("dynamic model called on a 0x0 image", lambda c: dynamic_model()(
        np.zeros((1, 0, 0, 3), np.float32)), ValueError,
        "Image height 0 is below 8 pixels (the patch size: it holds no patch)", "files"),
    Case("dynamic hybrid predicting on a 16x0 image", lambda c: dynamic_model(
        patch_size=1, resnet={"num_layers": ()}).predict(np.zeros((1, 16, 0, 3)), verbose=0),
        ValueError, "Image width 0 is below 1 pixel (an empty image)", "files"),
    Case("exported dynamic model fed one image without its batch axis",
         lambda c: exported_dynamic_model_fed(c, np.zeros((16, 16, 3))),
         tf.errors.InvalidArgumentError,
         "Shape of tensor images [16,16,3] is not compatible with expected shape [?,16,16,3]",
         "none"),
    Case("exported dynamic model fed a 0x0 image",
         lambda c: exported_dynamic_model_fed(c, np.zeros((1, 0, 0, 3))),
         tf.errors.InvalidArgumentError, "Shape of tensor images [1,0,0,3] is not compatible",
         "none"),
    # 14. Arguments of the Python API.
    Case("layout_map without a mesh", lambda c: keras_distribution.layout_map("Ti/16", None),
         ValueError, "`mesh` must be a keras.distribution.DeviceMesh", "files"),
    Case("masked_patch_model of None", lambda c: keras_vit.pretraining.masked_patch_model(None),
         ValueError, "`vit` must be a keras_vit.ViT model", "files"),
    Case("vtab tasks=42", lambda c: vtab.run(vtab_model, c.tmp / "vtab", tasks=42),
         ValueError, "`tasks` must be task or group names", "files"),
    Case("get_distribution on a device that is not there", lambda c: keras_vit.get_distribution(
        devices=["gpu:97"]), ValueError, "Device 'gpu:97' is not on this machine", "files"),
    Case("get_distribution on one device twice", lambda c: keras_vit.get_distribution(
        devices=["cpu:0", "cpu:0"]), ValueError, "names cpu:0 more than once", "files"),
    Case("get_distribution on no devices", lambda c: keras_vit.get_distribution(devices=[]),
         ValueError, "`devices` is empty", "files"),
    # 15. Minor ones.
    Case("cli usage error leaves no output folder", new_output_after_a_usage_error,
         CommandFailed, "hidden_size 9 is not divisible by num_heads 2", "none",
         after=no_folder("new")),
    Case("cli predict a folder", lambda c: c.cli("predict", c.tmp, "--weights", c.good),
         CommandFailed, "is a folder. Expected image files", "files"),
    Case("register a 300-character name", lambda c: keras_vit.register_checkpoint(
        "mine/" + "x" * 300, "file:///x.npz"), ValueError, "has a segment of 300 characters",
        "files"),
    Case("cli convert on a full disk", on_a_full_disk(lambda c: c.cli(
        "convert", c.good, c.tmp / "out.npz")), CommandFailed,
        "out.npz: File too large", "files"),
]


@pytest.fixture
def ctx(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(weights.registry, "_REGISTERED", {})
    monkeypatch.setattr(data.tfds, "_online", lambda: False)  # never download in a test
    return Context(tmp_path, capsys)


def library_error_classes():
    """Every exception class a keras_vit module defines."""
    import importlib
    import pkgutil

    found = set()
    for info in pkgutil.walk_packages(keras_vit.__path__, "keras_vit."):
        if info.name != "keras_vit.__main__":  # runs the command line
            module = importlib.import_module(info.name)
            found |= {value for value in vars(module).values() if isinstance(value, type)
                      and issubclass(value, Exception) and value.__module__ == info.name}
    return found


def test_every_case_has_its_own_name_and_every_library_error_class_a_case():
    names = [c.name for c in CASES]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert sorted(cls.__name__ for cls in library_error_classes()
                  - {c.error for c in CASES}) == []


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
    if hasattr(ctx, "run_files"):  # a run keeps its records as they were
        assert ctx.files(getattr(ctx, "run_dir", ctx.tmp / "run")) == ctx.run_files
    if hasattr(ctx, "export_files"):  # the existing export is untouched
        assert ctx.files(ctx.tmp / "e") == ctx.export_files
    if case.after is not None:
        case.after(ctx)


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
    training.compile_finetune(model, total_steps=8, warmup_steps=1)
    restore = training.BackupAndRestore(backup)
    restore.set_model(model)
    restore.on_train_begin()
    assert int(model.optimizer.iterations) == 2 * 3  # two epochs of three updates
    assert all(np.isfinite(v).all() for v in weights.model_params(model).values())


def test_a_file_url_is_fetched_again_when_the_file_changes(ctx, tmp_path):
    source = tmp_path / "mine.npz"
    weights.save_npz(ctx.model, source)
    keras_vit.register_checkpoint("mine/run", source.as_uri())
    first = keras_vit.ViT(**TINY)
    keras_vit.load_pretrained(first, "mine/run", progress=False)
    retrained = keras_vit.ViT(**TINY)
    retrained.get_layer("head").kernel.assign(np.ones((8, 3), np.float32))
    weights.save_npz(retrained, source, overwrite=True)
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
    from keras_vit.weights import config_json

    def heads(architecture):
        config = {"architecture": architecture}
        return config_json.timm_heads(config, config_json.declared_timm(config, "c.json")[0])

    assert heads("vit_small_patch8_224") == 6
    assert heads("vit_huge_patch14_clip_224") == 16
    assert heads("deit_base") is None


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


COMMAND_LINE_CASES = [
    (["predict", "missing.jpg", "--model", "B/16"], 2, "missing.jpg does not exist"),
    (["export", "out", "--model-config", '{"hiden": 1}'], 2, "unknown keys ['hiden']"),
    (["convert", "nothing.npz", "out.keras"], 2, "No checkpoint file at nothing.npz"),
    (["export", "out", "--model", "B/16", "--weights", "imagenet21k/ViT-B_17"], 2,
     "Unknown checkpoint 'imagenet21k/ViT-B_17'. Did you mean"),
    (["export", "out", "--model-config", json.dumps(dict(TINY, num_classes=5)),
      "--num-classes", "3"], 2,
     "--num-classes 3 contradicts the model's head of 5 classes (--model-config)"),
]


@pytest.mark.parametrize("argv, status, phrase", COMMAND_LINE_CASES)
def test_command_line_errors_exit_with_one_line_and_write_nothing(argv, status, phrase,
                                                                   tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == status
    err = capsys.readouterr().err
    assert phrase in err and "Traceback" not in err and err.strip().count("\n") == 0
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_command_line_error_in_a_real_process(tmp_path):
    argv, status, phrase = COMMAND_LINE_CASES[0]
    result = subprocess.run([sys.executable, "-m", "keras_vit", *argv], capture_output=True,
                            text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == status, result.stderr[-2000:]
    assert phrase in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_debug_shows_the_traceback_on_every_command_and_a_bug_is_one_line_without_it(
        tmp_path, capsys, monkeypatch):
    missing = str(tmp_path / "missing.jpg")
    for argv in (["--debug", "predict", missing], ["predict", missing, "--debug"]):
        with pytest.raises(FileNotFoundError, match="missing.jpg does not exist"):
            cli.main(argv)
    from keras_vit_cli import models

    def broken(args):
        raise KeyError("oops")

    monkeypatch.setitem(models.COMMANDS, "models", (models.COMMANDS["models"][0], broken))
    assert cli.main(["models"]) == 1
    assert capsys.readouterr().err == (
        "keras-vit models: error: internal error: KeyError: 'oops'. This is a bug in keras_vit: "
        "run the command again with --debug for the traceback, and report it.\n")
    with pytest.raises(KeyError, match="oops"):
        cli.main(["models", "--debug"])
    assert "--debug" in cli.build_parser(["train"]).format_help()
