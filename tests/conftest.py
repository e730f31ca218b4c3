import gc
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import keras  # noqa: E402
import pytest  # noqa: E402

# The objects of the libraries imported so far (Keras, TensorFlow) live as long as the session:
# they are moved out of the garbage collector's sight, so that the full collections Keras runs
# (`clear_session` after every test, `quantize` once per layer) scan only what tests create.
gc.freeze()


@pytest.fixture(autouse=True)
def _clean_keras_state():
    """Each test starts with float32 policy and a fresh Keras session."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


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
