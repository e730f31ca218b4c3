"""Helper for tests/test_training.py (no tests here): one fault-tolerant training run.

    python tests/test_training_resume_run.py IMAGE_FOLDER RUN_DIR FINAL_NPZ EPOCH_PAUSE_S

Fine-tunes a tiny ViT on an image folder with the library's pipeline, recipe and callbacks;
resumes from RUN_DIR/backup if a previous run was killed. EPOCH_PAUSE_S sleeps after each
epoch (after its backup) so that the test can kill the process in the middle of a run.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TINY = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            dropout_rate=0.1)
EPOCHS = 4


def main(folder, run_dir, final, pause):
    import keras
    import tensorflow as tf

    import keras_vit
    from keras_vit import checkpoint, data, training

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    start_epoch = training.resume_epoch(training.backup_dir(run_dir))
    print("start_epoch", start_epoch, flush=True)
    train = data.from_folder(folder, image_size=8, batch_size=4, training=True, seed=1,
                             start_epoch=start_epoch)
    model = keras_vit.ViT(num_classes=train.num_classes, **TINY)
    training.compile_finetune(model, learning_rate=0.05, total_steps=EPOCHS * train.steps_per_epoch,
                              warmup_steps=2)

    class Pause(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print("epoch_end", epoch, flush=True)
            time.sleep(pause)

    callbacks = training.training_callbacks(run_dir, monitor="loss", tensorboard=False)
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=EPOCHS,
              callbacks=callbacks + [Pause()], verbose=0)
    checkpoint.save_npz(model, final)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
