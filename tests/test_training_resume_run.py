"""Helper for tests/test_training.py (no tests here): one fault-tolerant training run.

    python tests/test_training_resume_run.py IMAGE_FOLDER RUN_DIR EPOCH_PAUSE_S

Fine-tunes a tiny ViT on an image folder with `keras_vit.training.fit`, which resumes from
RUN_DIR if a previous run was killed and writes RUN_DIR/final.npz. EPOCH_PAUSE_S sleeps after
each epoch (after its backup) so that the test can kill the process in the middle of a run.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TINY = dict(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
            dropout_rate=0.1)
EPOCHS = 4


def main(folder, run_dir, pause):
    import keras
    import tensorflow as tf

    import keras_vit
    from keras_vit import data, training

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    print("start_epoch", training.resume_epoch(training.backup_dir(run_dir)), flush=True)
    train = data.from_folder(folder, image_size=8, batch_size=4, training=True, seed=1)
    model = keras_vit.ViT(num_classes=train.num_classes, **TINY)

    class Pause(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print("epoch_end", epoch, flush=True)
            time.sleep(pause)

    training.fit(model, train, output_dir=run_dir, epochs=EPOCHS, learning_rate=0.05,
                 warmup_steps=2, callbacks=[Pause()], verbose=0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
