"""A/B of the attention's training path on a whole ViT-B/16 training step (TensorFlow + XLA, batch
8, keras_vit's AdamW), one process, rounds interleaved: do the layouts of
`benchmarks.attention_backward` carry over to the model?

    python -m benchmarks.attention_train_ab [--rounds 3] [--steps 4]

"einsum" is 0.2's training path (einsum products on `[B, N, h, k]`, autodiff), written out
here; "heads_first" transposes q, k, v once to `[B, h, N, k]` and uses batched matmuls
(autodiff); "current" is `MultiHeadDotProductAttention.call`, which adds the hand-written
backward of `keras_vit.layers.attention_core` (the softmax-gradient identity) to
"heads_first". Weights and outputs are the same (checked: first-step losses agree to 1e-4);
each switch recompiles the step (not timed).
"""

import argparse
import math
import statistics


def calls():
    import tensorflow as tf
    from keras import ops

    from keras_vit.layers import MultiHeadDotProductAttention as MHA

    current = MHA.call

    def einsum(self, inputs, training=None, return_attention_scores=False):
        if not training:
            return current(self, inputs, training, return_attention_scores)
        query, key, value = (layer(inputs) for layer in (self.query, self.key, self.value))
        probs = self.probabilities(query, key)
        context = ops.einsum("bhqs,bshk->bqhk", self.dropout(probs, training=training), value)
        outputs = self.out(context)
        return (outputs, probs) if return_attention_scores else outputs

    def heads_first(self, inputs, training=None, return_attention_scores=False):
        if not training:
            return current(self, inputs, training, return_attention_scores)
        query, key, value = (tf.transpose(layer(inputs), [0, 2, 1, 3])  # [B, h, N, k]
                             for layer in (self.query, self.key, self.value))
        scale = 1.0 / math.sqrt(self.head_dim)
        probs = tf.nn.softmax(tf.matmul(query * scale, key, transpose_b=True), axis=-1)
        context = tf.matmul(self.dropout(probs, training=training), value)
        outputs = self.out(tf.transpose(context, [0, 2, 1, 3]))  # [B, N, D]
        return (outputs, None) if return_attention_scores else outputs

    return {"einsum": einsum, "heads_first": heads_first, "current": current}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--variant", default="B/16")
    args = parser.parse_args(argv)
    from benchmarks.contenders import common
    from keras_vit import training
    from keras_vit.layers import MultiHeadDotProductAttention as MHA

    model, initial, x, y = common.seeded_model_and_batch(args.variant)
    variants = calls()
    results = {name: [] for name in variants}
    first_loss = {}
    for _ in range(args.rounds):
        for name, call in variants.items():
            MHA.call = call
            model.set_weights(initial)
            training.compile_model(model, training.AdamW(learning_rate=1e-4), jit_compile=True)
            first_loss.setdefault(name, float(model.train_on_batch(x, y)[0]))
            results[name].append(
                common.median_seconds(lambda: model.train_on_batch(x, y), args.steps))
    MHA.call = variants["current"]
    base = statistics.median(results["einsum"])
    print(f"ViT-{args.variant} training step, batch 8, TensorFlow + XLA, {args.rounds} "
          f"interleaved rounds of {args.steps} steps\n")
    print("| attention training path | step (median) | per round | vs einsum | first loss |")
    print("|---|---|---|---|---|")
    for name, values in results.items():
        step = statistics.median(values)
        print(f"| {name} | {step:.2f} s | {', '.join(f'{v:.2f}' for v in values)} | "
              f"{base / step:.3f}x | {first_loss[name]:.5f} |", flush=True)
    losses = list(first_loss.values())
    assert max(losses) - min(losses) < 1e-4, first_loss


if __name__ == "__main__":
    main()
