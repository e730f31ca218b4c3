import gc
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA (TensorFlow's `jit_compile` and JAX, here and in the interpreters tests start, which
# inherit this environment) compiles without LLVM's optimisation passes: the same programs
# (XLA's own passes all run), computed within the tests' tolerances, compiled in less time.
# Users' programs, and the benchmarks run from the command line, compile with XLA's defaults.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()
sys.path.insert(0, os.path.dirname(__file__))

import keras  # noqa: E402
import pytest  # noqa: E402

# The objects of the libraries imported so far (Keras, TensorFlow) live as long as the session:
# they are moved out of the garbage collector's sight, so that the full collections Keras runs
# (`clear_session` after every test, `quantize` once per layer) scan only what tests create.
# After each test, what survived its `clear_session` (a full collection, so all of it was
# reachable) is moved out of sight too: Keras' collections no longer rescan every earlier
# test's leftovers. Those objects are still freed by reference counting; only a reference
# cycle among them that a later fixture teardown drops stays until the worker ends.
gc.freeze()


@pytest.fixture(autouse=True)
def _clean_keras_state():
    """Each test starts with float32 policy, the measured default routes (a documentation
    block may choose some for the process) and a fresh Keras session."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
    routes = sys.modules.get("keras_vit.routes")  # once a test has imported keras_vit
    if routes is not None:
        routes.set_routes(**{name: routes.AUTO for name in routes.CHOICES})
    keras.backend.clear_session()  # a full collection: what is left is alive
    gc.freeze()


@pytest.fixture
def image_folder(tmp_path):
    """A class-per-subfolder image folder: 12 random 16x16 PNGs in classes c0 and c1."""
    import numpy as np
    from PIL import Image

    folder = tmp_path / "images"
    rng = np.random.default_rng(2)
    for i in range(12):
        path = folder / f"c{i % 2}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    return folder


@pytest.fixture
def timm_python():
    """The interpreter named by `KERAS_VIT_TIMM_PYTHON`, one with torch and timm (they are not
    dependencies of the package or of this interpreter). Without it the test is skipped, or
    fails under CI (`KERAS_VIT_CI=1`), where `.ci/run` builds that interpreter."""
    python = os.environ.get("KERAS_VIT_TIMM_PYTHON")
    if not python:
        reason = "KERAS_VIT_TIMM_PYTHON names no interpreter with timm"
        (pytest.fail if os.environ.get("KERAS_VIT_CI") == "1" else pytest.skip)(reason)
    return python


# ---------------------------------------------------------------------------------------------
# Tiers: every test file belongs to one, and its tests carry its marker (`pytest -m core`).
TIERS = {
    "core": ("numerics of the model, its layers, training, data and evaluation", (
        "test_model", "test_layout", "test_layout_data", "test_layout_training",
        "test_position_embeddings", "test_remat", "test_routes", "test_scan",
        "test_dynamic_size", "test_execution", "test_framework", "test_hybrid",
        "test_training", "test_training_resume_run", "test_data", "test_data_config",
        "test_pretraining", "test_evaluation", "test_inspect", "test_vtab", "test_distribute",
        "test_distribute_run", "test_jax", "test_jax_distribution", "test_structure",
        "test_intermediates")),
    "interop": ("file formats and other libraries: checkpoints, timm, keras-hub, exports", (
        "test_compat", "test_checkpoint_registry", "test_pretrained", "test_hub",
        "test_keras_hub", "test_onnx", "test_export", "test_roundtrip", "test_timm_interop",
        "test_data_config_roundtrip", "test_preprocessing_paths", "test_base_install")),
    "cli": ("the command line, the documentation and the benchmarks' own code", (
        "test_cli_checks", "test_cli_output", "test_cli_progress", "test_demo", "test_docs",
        "test_docs_site", "test_benchmarks")),
    "hostile": ("bad inputs, fuzzing, faults, signals and ownership", (
        "test_errors", "test_faults", "test_fuzz_cli", "test_fuzz_files", "test_hostile_cli",
        "test_hostile_files", "test_hostile_inputs", "test_ownership", "test_reader_fuzz",
        "test_silent_answers")),
}
TIER_OF = {module: tier for tier, (_, modules) in TIERS.items() for module in modules}


def pytest_configure(config):
    for tier, (what, _) in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module not in TIER_OF:
            raise pytest.UsageError(f"{module}.py belongs to no tier: add it to TIERS in "
                                    "tests/conftest.py")
        item.add_marker(TIER_OF[module])


# ---------------------------------------------------------------------------------------------
# Durations: with KERAS_VIT_DURATIONS=PATH (`.ci/run` sets it), the run writes where its time
# went: seconds per tier and per test file (setup, call and teardown of every test), then the
# 40 slowest tests.
DURATIONS_FILE = "KERAS_VIT_DURATIONS"
_DURATIONS = {}  # test id -> seconds (the reports of every worker reach the controller)
_STARTED = []


def pytest_sessionstart(session):
    _STARTED.append(time.monotonic())


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(DURATIONS_FILE)
    durations = _DURATIONS
    if not path or hasattr(session.config, "workerinput") or not durations:
        return  # not asked, an xdist worker (the controller writes), or nothing ran
    by_file, by_tier = {}, {}
    for nodeid, seconds in durations.items():
        module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        by_file[module] = by_file.get(module, 0.0) + seconds
        tier = TIER_OF.get(module, "?")
        by_tier[tier] = by_tier.get(tier, 0.0) + seconds
    total = sum(durations.values())
    wall = time.monotonic() - _STARTED[0] if _STARTED else float("nan")
    lines = [f"# Where the test suite's time goes: {len(durations)} tests in {wall / 60:.1f} "
             f"minutes, {total:.0f} s of test time (setup, call and teardown, summed over the "
             "workers).",
             f"# Written by a run with {DURATIONS_FILE} set (`bash .ci/run` on a clean clone).",
             "", "## Tiers (pytest -m TIER)", ""]
    lines += [f"{seconds:8.1f} s  {tier}" for tier, seconds in
              sorted(by_tier.items(), key=lambda kv: -kv[1])]
    lines += ["", "## Files", ""]
    lines += [f"{seconds:8.1f} s  {module} ({TIER_OF.get(module, '?')})" for module, seconds in
              sorted(by_file.items(), key=lambda kv: -kv[1])]
    lines += ["", "## The 40 slowest tests", ""]
    lines += [f"{seconds:8.1f} s  {nodeid}" for nodeid, seconds in
              sorted(durations.items(), key=lambda kv: -kv[1])[:40]]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
