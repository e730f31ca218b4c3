"""The benchmark harness (benchmarks/): FLOP counter, option checks, summaries, one real run.

No peer (timm, torch, keras-hub) is imported here: the harness runs each contender in its own
process, and the end-to-end test runs keras_vit's on a tiny input with this interpreter.
"""

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import flops

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# benchmarks/ is not installed with the package: import it from the checkout, as
# `python -m benchmarks.run` does, also when pytest is started from elsewhere.
sys.path.insert(0, REPO_ROOT)
from benchmarks import run  # noqa: E402
from benchmarks.contenders import common  # noqa: E402

# ------------------------------------------------------------------------------------------
# The analytic FLOP count.


def test_b16_forward_is_17_6_gmac_as_the_issue_says():
    macs = flops.vit_forward_macs(224, 16, hidden_size=768, num_layers=12, mlp_dim=3072)
    assert macs / 1e9 == pytest.approx(17.6, abs=0.05)
    # "One ViT-B/16 image costs about 35 GFLOP forward, so 5.9 img/s is already about 200
    # GFLOP/s" (issue 8): the same numbers through the MFU function with a peak of 1 FLOP/s.
    assert flops.step_flops(macs, training=False) / 1e9 == pytest.approx(35, abs=0.5)
    achieved = flops.model_flop_utilisation(5.9, macs, training=False, peak_flops=1.0)
    assert 190e9 < achieved < 220e9
    assert flops.model_flop_utilisation(5.9, macs, True, 1.0) == pytest.approx(3 * achieved)


def _shape(tensor):
    dims = tensor.shape.as_list()
    assert None not in dims, f"{tensor.name} has no static shape: {dims}"
    return dims


def graph_macs(model, batch):
    """MACs of every matrix product in the TensorFlow graph of `model`'s forward pass.

    Counted op by op from the traced graph's static shapes (MatMul, BatchMatMul, Einsum,
    Conv2D), independently of the formula in keras_vit/flops.py, over the ops the outputs
    depend on (the ones TensorFlow runs: the attention probabilities the blocks also return
    are computed apart and dropped when nothing reads them).
    """
    height, width, channels = model.input.shape[1:]
    spec = tf.TensorSpec((batch, height, width, channels), tf.float32)
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    needed, stack = set(), [t.op for t in function.outputs]
    while stack:
        op = stack.pop()
        if op.name not in needed:
            needed.add(op.name)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    total = 0
    for op in function.graph.get_operations():
        if op.name not in needed:
            continue
        if op.type == "MatMul":
            a = _shape(op.inputs[0])
            contracted = a[0] if op.get_attr("transpose_a") else a[1]
            total += math.prod(_shape(op.outputs[0])) * contracted
        elif op.type.startswith("BatchMatMul"):
            a = _shape(op.inputs[0])
            contracted = a[-2] if op.get_attr("adj_x") else a[-1]
            total += math.prod(_shape(op.outputs[0])) * contracted
        elif op.type == "Einsum":
            operands = op.get_attr("equation").decode().split("->")[0].split(",")
            assert len(operands) == 2 and "." not in "".join(operands), operands
            sizes = {}
            for letters, tensor in zip(operands, op.inputs, strict=True):
                sizes.update(zip(letters, _shape(tensor), strict=True))
            total += math.prod(sizes.values())  # one multiply-add per index combination
        elif op.type == "Conv2D":
            kh, kw, cin, _ = _shape(op.inputs[1])
            total += math.prod(_shape(op.outputs[0])) * kh * kw * cin
        else:
            assert "MatMul" not in op.type and "Conv" not in op.type, f"uncounted {op.type}"
    return total


@pytest.mark.parametrize(
    "config",
    [
        dict(image_size=32, patch_size=8, classifier="token"),
        dict(image_size=(16, 24), patch_size=(4, 8), classifier="gap", representation_size=24),
        dict(image_size=32, patch_size=16, classifier="token", include_top=False),
    ],
)
def test_forward_macs_equal_the_matrix_products_in_the_model_graph(config):
    sizes = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=48)
    model = keras_vit.ViT(num_classes=10, **sizes, **config)
    include_top = config.pop("include_top", True)
    expected = flops.vit_forward_macs(
        num_classes=10 if include_top else None,
        **{k: v for k, v in sizes.items() if k != "num_heads"},
        **config,
    )
    batch = 3
    assert graph_macs(model, batch) == batch * expected


@pytest.mark.parametrize("resnet, image_size, patch_size", [
    ((3, 4, 9), 64, 1),  # R50's stages: stride 16, projections on every stage's first unit
    ((2, 2, 2, 2), 96, 1),  # R26's: stride 32, a 3x3 feature map
    ((), 48, 4),  # the root block alone (R+Ti/16): 64 channels, 12x12 cells
])
def test_hybrid_macs_equal_the_convolutions_and_products_in_the_model_graph(resnet, image_size,
                                                                           patch_size):
    sizes = dict(hidden_size=16, num_layers=1, mlp_dim=24)
    config = dict(image_size=image_size, patch_size=patch_size, num_heads=2, num_classes=5,
                  resnet={"num_layers": resnet}, **sizes)
    model = keras_vit.ViT(**config)
    assert graph_macs(model, 2) == 2 * flops.config_forward_macs(config)
    stem, (height, width, channels) = flops.resnet_forward_macs(image_size, resnet)
    resnet_layer = model.get_layer("resnet")
    assert (height, width, channels) == resnet_layer.compute_output_shape(
        (None, image_size, image_size, 3))[1:]
    assert 0 < stem < flops.config_forward_macs(config)


@pytest.mark.parametrize("name", ["R+Ti/16", "R26+S/32", "R50+B/16"])
def test_hybrid_variant_macs_at_224_px_equal_its_graph(name):
    config = keras_vit.get_variant(name).config()
    assert graph_macs(keras_vit.ViT(**config), 1) == flops.config_forward_macs(config)


def test_variant_macs_at_224_px():
    """The paper's variants at 224 px with 1000 classes, as `keras-vit models` shows them."""
    variants = keras_vit.VARIANTS
    b16 = flops.config_forward_macs(variants["B/16"].config())
    assert round(b16 / 1e9, 2) == 17.56 and round(2 * b16 / 1e9, 1) == 35.1  # GFLOPs
    # A plain ViT by hand: 196 patches + the class token, 12 blocks of width 768.
    assert b16 == 196 * 768 * 768 + 12 * (4 * 197 * 768**2 + 2 * 197**2 * 768
                                          + 2 * 197 * 768 * 3072) + 768 * 1000
    # R50+B/16: the ResNet's stages (3, 4, 9) by hand, then B on its 14x14 feature map.
    convs = 112 * 112 * 49 * 3 * 64  # the 7x7/2 root on 224 px
    size, channels = 56, 64  # after the 3x3/2 max-pool
    for stage, units in enumerate((3, 4, 9)):
        f = 64 * 2**stage
        for unit in range(units):
            out = size // 2 if stage and not unit else size
            convs += size * size * channels * f + out * out * 9 * f * f + out * out * f * 4 * f
            if not unit:
                convs += out * out * channels * 4 * f
            size, channels = out, 4 * f
    hybrid = flops.config_forward_macs(variants["R50+B/16"].config())
    assert hybrid == convs + b16 - 196 * 768 * 768 + 196 * 1024 * 768
    assert flops.config_forward_macs(dict(variants["B/16"].config(), include_top=False)) == \
        b16 - 768 * 1000


def test_flop_counter_rejects_bad_input():
    with pytest.raises(ValueError, match=r"image_size \(32, 32\) is not divisible by patch_size"):
        flops.vit_forward_macs(32, 6, hidden_size=8, num_layers=1, mlp_dim=8)
    with pytest.raises(ValueError, match="Received: patch_size=0"):
        flops.vit_forward_macs(32, 0, hidden_size=8, num_layers=1, mlp_dim=8)
    with pytest.raises(ValueError, match=r"feature map \(4, 4\) is not divisible by patch_size"):
        flops.vit_forward_macs(64, 3, hidden_size=8, num_layers=1, mlp_dim=8,
                               resnet={"num_layers": (1, 1, 1)})
    with pytest.raises(ValueError, match="'token' or 'gap'. Received: 'cls'"):
        flops.vit_forward_macs(32, 8, hidden_size=8, num_layers=1, mlp_dim=8, classifier="cls")
    with pytest.raises(ValueError, match="Received: -1"):
        flops.model_flop_utilisation(1.0, 10, False, peak_flops=-1)


# ------------------------------------------------------------------------------------------
# Options and contenders.


def test_contender_names_parse():
    assert run.parse_contender("keras_vit-xla-bf16", "fp32") == run.Contender(
        "keras_vit", True, "bf16"
    )
    assert run.parse_contender("keras-hub", "bf16") == run.Contender("keras_hub", None, "bf16")
    assert run.parse_contender("keras_vit-noxla", "fp32").xla is False
    tree = run.parse_contender(f"keras_vit-xla@{REPO_ROOT}", "fp32")
    assert tree.tree == REPO_ROOT and tree.name == f"keras_vit-xla-fp32@{REPO_ROOT}"
    int8 = run.parse_contender("keras_vit-int8", "fp32")
    assert int8.modes == ("infer",) and int8.name == "keras_vit-int8"
    assert run.parse_contender("timm", "fp32").modes == ("infer", "train")


@pytest.mark.parametrize(
    "text, message",
    [
        ("pytorch", "Unknown contender 'pytorch'. Expected FAMILY"),
        ("keras_vit-xla-xla", "repeated tag 'xla' in contender 'keras_vit-xla-xla'"),
        ("keras_vit-fp16", "Unknown or repeated tag 'fp16'"),
        ("timm-xla", "timm runs on PyTorch and has no XLA variant"),
        ("keras_hub-int8", "int8 is measured for keras_vit only"),
        ("keras_vit-xla-noxla", "repeated tag 'noxla'"),
        ("keras_vit@/nonexistent", "'/nonexistent' is not a checkout of this repository"),
    ],
)
def test_bad_contender_names_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        run.parse_contender(text, "fp32")


def plan_for(*argv):
    return run.make_plan(run.build_parser().parse_args(list(argv)))


def test_plan_defaults_per_device():
    cpu = plan_for()
    assert cpu.models == ["Ti/16", "B/16", "L/16"] and cpu.batches == [8] and cpu.rounds == 5
    assert [c.name for c in cpu.contenders] == [
        "timm-fp32",
        "keras_hub-fp32",
        "keras_hub-xla-fp32",
        "keras_vit-fp32",
        "keras_vit-xla-fp32",
        "keras_vit-bf16",
        "keras_vit-xla-bf16",
        "keras_vit-int8",
        "keras_vit-xla-int8",
    ]
    assert cpu.peak_flops is None
    gpu = plan_for("--device", "gpu")
    assert gpu.batches == [64, 256] and gpu.peak_flops == 989e12
    assert {c.precision for c in gpu.contenders} == {"bf16"}
    assert plan_for("--device", "gpu", "--peak-flops", "1e15").peak_flops == 1e15


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--batch", "0"],
            r"--batch must be a comma-separated list of integers >= 1. Received: '0'",
        ),
        (["--batch", "8,x"], r"Received: '8,x'"),
        (["--rounds", "0"], r"--rounds .* Received: '0'"),
        (["--rounds", "2,3"], r"--rounds must be an integer >= 1. Received: '2,3'"),
        (["--seed", "-1"], r"--seed must be an integer >= 0. Received: '-1'"),
        (["--warmup", "x"], r"--warmup must be an integer >= 0. Received: 'x'"),
        (["--models", "B/17"], "Unknown ViT variant 'B/17'"),
        (["--models", "R50+B/16"], "Hybrid variant 'R50\\+B/16' has no counterpart"),
        (["--models", "B/16", "--image-size", "200"], "--image-size 200 is not divisible by B/16"),
        (["--points", "B/16@200x4"], "--points B/16@200x4 is not divisible by B/16's patch size"),
        (["--points", "B/16@384"], r"--points: 'B/16@384' is not MODEL@SIZExBATCH"),
        (["--points", "B/16@384x0"], r"--points: 'B/16@384x0' is not MODEL@SIZExBATCH"),
        (["--points", "B/17@224x4"], "Unknown ViT variant 'B/17'"),
        (["--modes", "infer,test"], "--modes must be infer, train or infer,train. Received: "),
        (["--contenders", "timm,timm"], r"--contenders names \['timm-fp32'\] twice"),
        (["--contenders", ","], "--contenders names no contender"),
        (["--peak-flops", "0"], "--peak-flops must be positive. Received: 0"),
        (["--int8-checkpoint", "/nonexistent.npz"], "'/nonexistent.npz' is not a file"),
        (
            ["--int8-checkpoint", __file__, "--contenders", "timm,keras_vit"],
            "needs an int8 contender .* Received: timm-fp32,keras_vit-fp32",
        ),
        (
            ["--int8-checkpoint", __file__, "--contenders", "keras_vit-int8",
             "--agreement-images", "0"],
            "--int8-checkpoint compares on --agreement-images images; expected at least 1",
        ),
    ],
)
def test_bad_options_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        plan_for(*argv)


def test_main_reports_bad_options_without_running(capsys):
    assert run.main(["--batch", "-3"]) == 2
    assert "benchmarks.run: error: --batch" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# Summaries and the table, from measured-looking rounds.


def test_summary_takes_medians_max_rss_and_ratios_to_timm():
    plan = plan_for("--models", "B/16", "--contenders", "timm,keras_vit,keras_vit-int8")
    timm, ours, int8 = plan.contenders
    rng = np.random.default_rng(0)

    def rounds(modes):
        out = []
        for i, mode in enumerate(modes):
            out.append(
                dict(
                    mode=mode,
                    round=i // 2 + 1,
                    images_per_s=float(rng.uniform(1, 10)),
                    first_step_s=float(rng.uniform(1, 60)),
                    peak_rss_bytes=int(rng.integers(1e9, 5e9)),
                    import_s=1.0,
                    versions={"timm": "1.0.31", "torch": "2.13.0+cpu"},
                )
            )
        return out

    entries = [
        dict(model="B/16", image_size=224, batch=8, contender=c,
             rounds=rounds(["infer", "train"] * 3))
        for c in (timm, ours)
    ]
    agreement = dict(
        mode="agreement",
        round=1,
        top1_agreement=0.75,
        distinct_top1=3,
        images=4,
        centred=dict(top1_agreement=0.5, distinct_top1=4, images=4),
        relative_logit_error=0.25,
        source="random B/16",
    )
    entries.append(
        dict(model="B/16", image_size=224, batch=8, contender=int8,
             rounds=rounds(["infer"] * 3) + [agreement])
    )
    for entry in entries:
        entry["summary"], entry["versions"] = run.summarize(entry, plan)

    def raw(entry, mode, key):
        return [r[key] for r in entry["rounds"] if r["mode"] == mode]

    for entry in entries:
        s = entry["summary"]
        assert s["infer_images_per_s"] == np.median(raw(entry, "infer", "images_per_s"))
        macs = flops.vit_forward_macs(224, 16, hidden_size=768, num_layers=12, mlp_dim=3072)
        assert s["infer_tflops"] == pytest.approx(s["infer_images_per_s"] * 2 * macs / 1e12)
    s_timm, s_ours = entries[0]["summary"], entries[1]["summary"]
    assert s_ours["train_images_per_s"] == np.median(raw(entries[1], "train", "images_per_s"))
    assert s_ours["first_step_s"] == np.median(raw(entries[1], "train", "first_step_s"))
    assert s_ours["peak_rss_train_bytes"] == max(raw(entries[1], "train", "peak_rss_bytes"))
    assert "train_images_per_s" not in entries[2]["summary"]
    assert entries[2]["summary"]["agreement"]["centred"]["top1_agreement"] == 0.5

    table = run.markdown_table(entries, plan)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| timm 1.0.31 (torch 2.13.0+cpu), fp32 |")
    ratio = s_ours["infer_images_per_s"] / s_timm["infer_images_per_s"]
    assert f"{s_ours['infer_images_per_s']:.2f} ({ratio:.2f}x)" in rows[2]
    ratio = s_ours["peak_rss_train_bytes"] / s_timm["peak_rss_train_bytes"]
    assert f"{s_ours['peak_rss_train_bytes'] / 1e9:.2f} GB ({ratio:.2f}x)" in rows[2]
    ratio = entries[2]["summary"]["infer_images_per_s"] / s_timm["infer_images_per_s"]
    assert f"({ratio:.2f}x) | – |" in rows[3]  # int8 vs timm fp32; no training
    assert "75.0% (distinct top-1 classes: 3), centred logits 50.0% (distinct: 4)" in rows[3]


def test_gpu_table_reports_model_flop_utilisation():
    plan = plan_for("--device", "gpu", "--models", "B/16", "--batch", "256", "--peak-flops", "8e14")
    (contender,) = [c for c in plan.contenders if c.name == "keras_vit-xla-bf16"]
    rounds = [
        dict(mode="infer", round=1, images_per_s=3000.0),
        dict(mode="train", round=1, images_per_s=1000.0, first_step_s=20.0,
             peak_rss_bytes=int(5e9), device_peak_bytes=int(30e9)),
    ]  # fmt: skip
    entry = dict(model="B/16", image_size=224, batch=256, contender=contender, rounds=rounds)
    entry["summary"], entry["versions"] = run.summarize(entry, plan)
    macs = flops.vit_forward_macs(224, 16, hidden_size=768, num_layers=12, mlp_dim=3072)
    train_mfu = 1000.0 * 3 * 2 * macs / 8e14
    assert entry["summary"]["train_mfu"] == pytest.approx(train_mfu)
    assert entry["summary"]["infer_mfu"] == pytest.approx(3000.0 * 2 * macs / 8e14)
    (row,) = [r for r in run.markdown_table([entry], plan).splitlines() if r.startswith("| keras")]
    assert f"| 30.00 GB | {3000.0 * 2 * macs / 8e14:.1%} | {train_mfu:.1%} |" in row


def test_top1_agreement_counts_argmax_matches():
    reference = np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0], [0.0, 0.2, 0.1], [3.0, 0.0, 0.0]])
    other = reference.copy()
    other[2] = [0.0, 0.1, 0.2]  # top-1 moves from class 1 to class 2
    result = common.top1_agreement(reference, other)
    assert result == dict(top1_agreement=0.75, distinct_top1=2, images=4)


# ------------------------------------------------------------------------------------------
# One real run, end to end: the driver, the process protocol, the JSON.


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None,
    reason="this test uses timm's absence from the test environment for its failure path",
)
def test_run_measures_keras_vit_and_reports_a_failing_contender(tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "--models", "Ti/16", "--image-size", "32", "--batch", "2", "--rounds", "2",
        "--contenders", "timm,keras_vit", "--modes", "infer", "--infer-steps", "2",
        "--warmup", "0", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr  # a contender failed
    document = json.loads(out.read_text())
    timm, ours = document["results"]
    # timm cannot import here: one failed round, not retried in round 2, reported in the table.
    assert timm["contender"] == "timm-fp32" and len(timm["rounds"]) == 1
    assert "No module named 'torch'" in timm["summary"]["error"]
    assert "FAILED: " in done.stdout and "No module named" in done.stdout
    # keras_vit: two rounds of two timed steps; throughput is batch over the median step.
    assert ours["contender"] == "keras_vit-fp32" and [r["round"] for r in ours["rounds"]] == [1, 2]
    per_round = []
    for result in ours["rounds"]:
        assert len(result["step_s"]) == 2 and all(t > 0 for t in result["step_s"])
        assert result["images_per_s"] == pytest.approx(2 / statistics.median(result["step_s"]))
        assert result["first_step_s"] >= result["build_s"] > 0
        assert result["peak_rss_bytes"] > 100e6  # TensorFlow alone takes more
        assert result["versions"]["keras"] == keras.__version__
        per_round.append(result["images_per_s"])
    rate = ours["summary"]["infer_images_per_s"]
    assert rate == pytest.approx(statistics.median(per_round))
    label = f"keras_vit {keras_vit.__version__}, default runtime, fp32"
    assert f"| {label} | {rate:.2f} | – |" in done.stdout  # no timm to compare
    macs = flops.vit_forward_macs(32, 16, hidden_size=192, num_layers=12, mlp_dim=768)
    assert document["models"]["Ti/16"]["forward_macs"] == macs
    assert ours["summary"]["infer_tflops"] == pytest.approx(rate * 2 * macs / 1e12)
    assert document["plan"]["contenders"] == ["timm-fp32", "keras_vit-fp32"]


def test_route_variants_parse():
    from benchmarks import routes

    assert routes.parse_variant("default") == ("keras_vit", {})
    assert routes.parse_variant("attention=products,scan=blocks,optimizer=keras") == (
        "keras", {"attention": "products", "scan": "blocks"})
    assert routes.parse_variant("remat=blocks") == ("keras_vit", {"remat": "blocks"})
    for bad in ("attention", "flash=on", "optimizer=sgd"):
        with pytest.raises(ValueError, match="expected CHOICE=IMPLEMENTATION"):
            routes.parse_variant(bad)
    with pytest.raises(ValueError, match="must be one of 'auto', 'products', 'fused'"):
        routes.parse_variant("attention=flash")
    with pytest.raises(ValueError, match="must be one of 'auto', 'none', 'blocks'"):
        routes.parse_variant("scan=true")


def test_points_are_measured_each_at_its_size_and_batch(monkeypatch):
    plan = plan_for("--points", "B/16@224x8,B/16@384x4,L/16@224x4,B/16@384x4",
                    "--contenders", "timm,keras_vit", "--rounds", "1")
    assert plan.points == [("B/16", 224, 8), ("B/16", 384, 4), ("L/16", 224, 4)]
    assert plan.models == ["B/16", "L/16"] and plan.batches == [4, 8]
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        result = dict(images_per_s=1.0, first_step_s=2.0, peak_rss_bytes=3, import_s=0.5,
                      versions={})
        return subprocess.CompletedProcess(command, 0, common.RESULT_PREFIX + json.dumps(result),
                                           "")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    entries = run.run_all(plan)
    sizes = [(c[c.index("--image-size") + 1], c[c.index("--batch") + 1], c[c.index("--model") + 1])
             for c in commands]
    assert sorted(set(sizes)) == [("224", "4", "L/16"), ("224", "8", "B/16"), ("384", "4", "B/16")]
    assert len(commands) == 3 * 2 * 2  # points x contenders x modes
    assert [(e["model"], e["image_size"], e["batch"]) for e in entries[::2]] == plan.points


def _point_entries(plan):
    """Two contenders' summaries at each of `plan`'s points: keras_vit twice timm's speed and
    memory at the first point, half at the others."""
    entries = []
    for index, (model, size, batch) in enumerate(plan.points):
        for contender in plan.contenders:
            factor = 1.0 if contender.family == "timm" else (2.0 if index == 0 else 0.5)
            entry = dict(model=model, image_size=size, batch=batch, contender=contender,
                         versions={}, rounds=[])
            entry["summary"] = dict(infer_images_per_s=10 * factor, train_images_per_s=factor,
                                    peak_rss_train_bytes=int(4e9 * factor),
                                    peak_rss_infer_bytes=int(1e9 * factor),
                                    first_step_s=5 * factor)
            entries.append(entry)
    return entries


def test_points_table_gives_keras_vits_ratios_to_timm_at_each_point():
    plan = plan_for("--points", "B/16@224x8,B/16@384x4", "--contenders",
                    "timm,timm-bf16,keras_vit,keras_vit-bf16")
    table = run.points_table(_point_entries(plan))
    rows = [line for line in table.splitlines() if line.startswith("| B/16")]
    assert rows[0] == ("| B/16, 224 px, batch 8 | 2.00x / 2.00x | 2.00x / 2.00x | "
                       "2.00x (8.00 vs 4.00) / 2.00x (8.00 vs 4.00) | 2.00x / 2.00x | "
                       "2.00x (2.00 vs 1.00) / 2.00x (2.00 vs 1.00) |")
    assert rows[1].startswith("| B/16, 384 px, batch 4 | 0.50x / 0.50x | 0.50x / 0.50x | "
                              "0.50x (2.00 vs 4.00)")


def test_plot_draws_speed_and_memory_against_tokens(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plot

    plan = plan_for("--points", "B/16@224x4,B/16@384x4", "--contenders", "timm,keras_vit")
    entries = _point_entries(plan)
    entries[-1]["summary"] = dict(error="out of memory")
    document = dict(models=plan.configs, machine=dict(cpu="a CPU"), results=[
        dict(e, contender=e["contender"].name, label=e["contender"].name) for e in entries])
    lines, failed = plot.series(document)
    assert lines[("keras_vit-fp32", "B/16")]["train_images_per_s"] == [(197, 2.0)]
    assert lines[("timm-fp32", "B/16")]["peak_rss_train_bytes"] == [(197, 4.0), (577, 4.0)]
    assert failed == ["keras_vit-fp32 B/16 384 px"]
    (tmp_path / "r.json").write_text(json.dumps(document))
    assert plot.main([str(tmp_path / "r.json"), str(tmp_path / "out.png")]) == 0
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.main([str(tmp_path / "r.json"), str(tmp_path / "m.png"), "--only", "memory"]) == 0
    assert (tmp_path / "m.png").stat().st_size < (tmp_path / "out.png").stat().st_size


def test_the_pipeline_benchmark_reads_every_batch_and_reports_its_rate(tmp_path, monkeypatch,
                                                                       capsys):
    """benchmarks.pipeline on a small folder: the keras_vit loader's report (in-process) counts
    every batch of every epoch and gives a positive rate and memory."""
    from benchmarks import pipeline

    monkeypatch.setattr(pipeline, "IMAGES", 16)
    monkeypatch.setattr(pipeline, "BATCH", 8)
    monkeypatch.setattr(pipeline, "SIZE", 32)
    pipeline.prepare(str(tmp_path))
    assert sum(len(files) for _, _, files in os.walk(tmp_path)) == 16
    pipeline.keras_vit_job(str(tmp_path), epochs=2)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["batches"] == 4  # 2 epochs of 16 images in batches of 8
    assert report["images_per_s"] > 0 and report["peak_rss_bytes"] > 10**8


def test_the_pipeline_benchmark_names_a_missing_folder(tmp_path, capsys):
    from benchmarks import pipeline

    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(["compare", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert "missing is not a folder" in capsys.readouterr().err
