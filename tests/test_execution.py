"""How a model executes (`keras_vit.execution`): the device probe, the one precision table that
training and export read, and the runtime defaults (XLA or TensorFlow's graph runtime, from the
measured table, for the device, the CPU's features and the precision); what training, the
recipes and the export choose by default; the choice recorded with its reason."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import data, devices, execution, export, routes, training

TINY = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            num_classes=3)
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})


def test_the_device_probe_reads_keras_devices(monkeypatch):
    for listed, kind in ((["cpu:0"], "cpu"), (["CPU:0", "cpu:1"], "cpu"),
                         (["gpu:0", "gpu:1"], "gpu"), (["tpu:0"], "gpu")):
        monkeypatch.setattr(keras.distribution, "list_devices", lambda: listed)
        assert (devices.device_kind(), devices.on_cpu()) == (kind, kind == "cpu")
        assert routes.route("attention", False) == ("products" if kind == "cpu" else "fused")


@pytest.mark.parametrize("precision, policy", [("float32", "float32"),
                                               ("bfloat16", "mixed_bfloat16"),
                                               ("float16", "mixed_float16")])
def test_the_precision_table_reads_both_ways(precision, policy):
    assert execution.policy_name(precision) == policy
    assert execution.precision_of(policy) == precision
    assert execution.precision_of(keras.DTypePolicy(policy)) == precision


@pytest.mark.parametrize("precision, compute", [("float32", "float32"),
                                                ("bfloat16", "bfloat16")])
def test_training_and_export_take_the_same_precision_names(precision, compute):
    """A precision name means the same computation to training and to the export: float32
    weights and logits, the blocks computing in `compute`."""
    try:
        training.set_precision(precision)
        trained = keras_vit.ViT(**TINY)
    finally:
        keras.config.set_dtype_policy("float32")
    exported = export.at_precision(keras_vit.ViT(**TINY), precision)
    for model in (trained, exported):
        block = model.get_layer("encoderblock_0")
        assert (block.compute_dtype, block.variable_dtype) == (compute, "float32")
        assert model.outputs[0].dtype == "float32"


def test_precisions_outside_a_command_are_refused_naming_the_ones_it_takes():
    assert execution.precision_of("int8_from_float32") == "float32"  # outside the table
    with pytest.raises(ValueError, match="`precision` must be one of 'float32', 'bfloat16'. "
                                         "Received: precision='float16'"):
        export.at_precision(keras_vit.ViT(**TINY), "float16")
    with pytest.raises(ValueError, match="Received: precision='mixed_bfloat16'"):
        execution.policy_name("mixed_bfloat16")  # a policy is not a precision name


@pytest.mark.parametrize("device, flags, precision, xla", [
    ("cpu", AMX, "bfloat16", False),
    ("cpu", AMX, "float32", False),
    ("cpu", ZEN4, "bfloat16", False),
    ("cpu", ZEN4, "float32", False),
    ("cpu", AVX2, "float32", True),
    ("cpu", frozenset(), "bfloat16", True),
    ("gpu", frozenset(), "bfloat16", True),
    ("gpu", AMX, "float32", True),
])
def test_the_table_chooses_per_device_cpu_and_precision(device, flags, precision, xla):
    row = execution.table_row(precision, device, flags)
    assert row.xla is xla
    assert ("AMX" in row.why) == (device == "cpu" and "amx_tile" in flags)


def test_choose_reads_this_machine_and_the_policy(monkeypatch):
    monkeypatch.setattr(execution, "cpu_flags", lambda: AVX2)
    assert execution.choose("mixed_bfloat16") == (True, execution.TABLE[-1].why)
    monkeypatch.setattr(execution, "cpu_flags", lambda: ZEN4)
    assert execution.choose("mixed_bfloat16")[0] is False
    assert execution.precision_of("mixed_bfloat16") == "bfloat16"
    assert execution.precision_of(keras.DTypePolicy("float32")) == "float32"


def test_where_xla_does_not_work_it_is_off_whatever_the_table(monkeypatch):
    monkeypatch.setattr(execution, "cpu_flags", lambda: AVX2)  # a table that says XLA
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) \
        if len(tf.config.list_logical_devices("CPU")) > 1 else None
    if strategy is not None:
        xla, why = execution.choose("float32", strategy)
        assert xla is False and "2 replicas" in why
    monkeypatch.setattr(execution.framework, "op_determinism_enabled", lambda: True)
    xla, why = execution.choose("float32")
    assert xla is False and "op determinism" in why


@pytest.mark.parametrize("flags, xla", [(AVX2, True), (ZEN4, False)])
def test_the_recipes_and_export_take_the_table_by_default(monkeypatch, tmp_path, flags, xla):
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["cpu:0"])
    monkeypatch.setattr(execution, "cpu_flags", lambda: flags)
    model = keras_vit.ViT(**TINY)
    training.compile_model(model, training.AdamW(1e-3))
    assert model.jit_compile is xla
    training.compile_model(model, training.AdamW(1e-3), jit_compile=not xla)
    assert model.jit_compile is (not xla)  # an explicit choice overrides
    path = export.export_saved_model(keras_vit.ViT(**TINY), tmp_path / "vit", warmup=False)
    metadata = json.loads((tmp_path / "vit" / "1" / "assets.extra" / "keras_vit.json")
                          .read_text())
    assert metadata["xla"] is xla
    assert metadata["runtime"].startswith("a CPU with AVX2 and no AVX-512:" if xla
                                          else "a CPU with AVX-512:")
    assert path.endswith("1")


def test_fit_records_the_runtime_and_why(monkeypatch, tmp_path):
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["cpu:0"])
    monkeypatch.setattr(execution, "cpu_flags", lambda: ZEN4)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (8, 8, 8, 3), dtype=np.uint8), np.arange(8) % 3
    train = data.from_arrays(x, y, image_size=8, batch_size=4, training=True)
    summary = training.fit(keras_vit.ViT(**TINY), train, output_dir=tmp_path / "run", epochs=1,
                           verbose=0)
    assert summary["xla"] is False and summary["runtime"].startswith("a CPU with AVX-512:")
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["runtime"]
    assert recorded == {"xla": False, "why": summary["runtime"]}
    summary = training.fit(keras_vit.ViT(**TINY), train, output_dir=tmp_path / "xla", epochs=1,
                           jit_compile=True, verbose=0)
    assert (summary["xla"], summary["runtime"]) == (True, "asked for (jit_compile=True)")
