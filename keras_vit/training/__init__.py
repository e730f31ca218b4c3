"""Training: the paper's recipes, resumable runs, and `fit`, the one way to train.

- `fit(model, train, validation, output_dir=...)`: the whole run (see `keras_vit.training.loop`).
- Recipes (`keras_vit.training.recipes`): `compile_finetune`, `compile_pretrain`,
  `compile_masked_patches`, `compile_recipe`, `compile_model`, the optimizers, `WarmupDecay`,
  the loss, `set_precision`; `AdamW` (`keras_vit.training.optimizers`).
- `enable_compilation_cache(directory)`: JAX's persistent compilation cache.
- Callbacks (`keras_vit.training.callbacks`): `BackupAndRestore`, `BestCheckpoint`,
  `training_callbacks`, for your own `model.fit`; `best_record` (best.json, checked against
  best.npz) and `StateFileError` (a run's state file that is unreadable or not its own).
"""

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
from keras_vit.training.compilation import enable_compilation_cache
from keras_vit.training.loop import RunFinished, TrainingDiverged, check_output_dir, fit, plan
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
    PRECISIONS,
    PRETRAIN_BETA_1,
    PRETRAIN_BETA_2,
    PRETRAIN_WARMUP_STEPS,
    PRETRAIN_WEIGHT_DECAY,
    RECIPES,
    SparseCategoricalCrossentropy,
    WarmupDecay,
    accumulation_steps,
    build_training_state,
    compile_finetune,
    compile_masked_patches,
    compile_model,
    compile_pretrain,
    compile_recipe,
    default_jit_compile,
    default_warmup_steps,
    finetune_optimizer,
    pretrain_optimizer,
    recipe_defaults,
    set_precision,
)
