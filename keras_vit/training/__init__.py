"""Training: the paper's recipes, resumable runs, and `fit`, the one way to train.

Training flows one way, each module calling only those below it (`tests/test_layout_training.py`):
`fit` (`loop`: the run's plan, its files, Keras' `fit`) -> `recipes` (the paper's optimizers
and schedules) -> `compilation` (`compile_model`: XLA or not, Keras' fixes) -> `state`
(`build_training_state`) -> `keras_vit.parallel`, `keras_vit.framework`.

- `fit(model, train, validation, output_dir=...)`: the whole run (see `keras_vit.training.loop`).
- Recipes (`keras_vit.training.recipes`): `compile_finetune`, `compile_pretrain`,
  `compile_masked_patches`, `compile_recipe`, the optimizers, `WarmupDecay`, `set_precision`;
  `AdamW` (`keras_vit.training.optimizers`, its fused update in `keras_vit.training.adam`).
- Compiling (`keras_vit.training.compilation`): `compile_model`, `default_jit_compile`,
  `enable_compilation_cache(directory)` (JAX's persistent compilation cache); the loss
  (`keras_vit.training.losses`); `build_training_state` (`keras_vit.training.state`).
- Callbacks (`keras_vit.training.callbacks`): `BackupAndRestore`, `BestCheckpoint`,
  `training_callbacks`, for your own `model.fit`; `best_record` (best.json, checked against
  best.npz) and `StateFileError` (a run's state file that is unreadable or not its own).

`fit` and the names of its module load on first use: they take `keras_vit.data` pipelines
(`tf.data`), and the rest trains on the JAX backend in a process without TensorFlow
(`compile_model` or a recipe, `AdamW`, then Keras' own `model.fit`).
"""

from keras_vit.execution import PRECISIONS
from keras_vit.lazy import lazy_attributes as _lazy_attributes
from keras_vit.training.callbacks import (
    BackupAndRestore,
    BackupError,
    BestCheckpoint,
    StateFileError,
    backup_dir,
    best_record,
    resume_epoch,
    training_callbacks,
)
from keras_vit.training.compilation import (
    compile_model,
    default_jit_compile,
    enable_compilation_cache,
)
from keras_vit.training.losses import SparseCategoricalCrossentropy
from keras_vit.training.optimizers import AdamW
from keras_vit.training.recipes import (
    DECAYS,
    DEFAULT_LEARNING_RATES,
    FINETUNE_BATCH_SIZE,
    FINETUNE_GLOBAL_CLIPNORM,
    FINETUNE_LEARNING_RATES,
    FINETUNE_MOMENTUM,
    FINETUNE_WARMUP_STEPS,
    LINEAR_DECAY_END,
    MAX_WARMUP_FRACTION,
    MPP_BATCH_SIZE,
    MPP_LEARNING_RATE,
    MPP_STEPS,
    PRETRAIN_BETA_1,
    PRETRAIN_BETA_2,
    PRETRAIN_WARMUP_STEPS,
    PRETRAIN_WEIGHT_DECAY,
    RECIPES,
    WarmupDecay,
    accumulation_steps,
    compile_finetune,
    compile_masked_patches,
    compile_pretrain,
    compile_recipe,
    default_warmup_steps,
    finetune_optimizer,
    pretrain_optimizer,
    recipe_defaults,
    set_precision,
)
from keras_vit.training.state import build_training_state

# The names of `keras_vit.training.loop`, which loads TensorFlow (`tf.data`) on first use.
_LOOP_NAMES = ("RunFinished", "TrainingDiverged", "check_output_dir", "fit", "plan")
__all__ = sorted({name for name in globals() if not name.startswith("_")} | set(_LOOP_NAMES))


__getattr__, __dir__ = _lazy_attributes(
    globals(), dict.fromkeys(_LOOP_NAMES, f"{__name__}.loop"), ("loop",))
