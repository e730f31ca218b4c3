"""Looking inside a trained ViT: the paper's Figure 7 and attention maps, as arrays and PNGs.

Paper section 4.5 and Figure 7 (Dosovitskiy et al., 2020), and attention rollout
(Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"):

- `attention_rollout` / `attention_map`: which patches the class token (or, in "gap" models,
  the mean token) draws on, through all layers or in one layer and head;
- `mean_attention_distance` (Figure 7 right): how far, in pixels, each head looks;
- `position_embedding_similarity` (Figure 7 centre): cosine similarity of the position
  embeddings, one tile per patch;
- `patch_embedding_components` (Figure 7 left): principal components of the patch-embedding
  filters, as RGB patches.

Each `plot_*` function writes a PNG (matplotlib, without pyplot, so no global backend is
touched) and returns the arrays it drew. `inspect_model` writes each that applies to the
model (all four but for hybrids and models without position embeddings); `keras-vit inspect`
does the same from the command line.

Attention probabilities are the encoder blocks' own, from `keras_vit.attention_model(model)`
(a model sharing the weights), collected for every layer in one forward pass; nothing here
re-implements attention. The arrays are computed in `inspection.analysis`, the figures drawn
in `inspection.figures`.

Example (a random model: train one, or load weights, to see something):

    import numpy as np
    import keras_vit
    from keras_vit import inspection as inspect

    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
                          num_heads=4, mlp_dim=64, num_classes=10)
    images = keras_vit.preprocess_inputs(np.zeros((2, 32, 32, 3)))
    inspect.attention_rollout(model, images).shape        # (2, 4, 4)
    inspect.mean_attention_distance(model, images).shape  # (2, 4): layers x heads
    inspect.inspect_model(model, images, "figures")       # the PNGs
"""


from keras_vit.inspection.analysis import (  # noqa: F401
    NUM_COMPONENTS,
    Geometry,
    geometry,
    attention_probe,
    attention_weights,
    check_layer_head,
    rollout,
    patch_distances,
    attention_rollout,
    attention_map,
    mean_attention_distance,
    upsample,
    has_position_embeddings,
    position_embedding_similarity,
    patch_embedding_components,
)
from keras_vit.inspection.figures import (  # noqa: F401
    DPI,
    ATTENTION_PANEL,
    ATTENTION_TITLE,
    MAX_ATTENTION_IMAGES,
    DISTANCE_SIZE,
    SIMILARITY_GRID,
    SIMILARITY_MARGINS,
    SIMILARITY_COLORBAR,
    FILTER_TILE,
    FILTER_COLUMNS,
    FILTER_TITLE,
    FILTER_MIN_WIDTH,
    FIGURE_FILES,
    attention_size,
    plot_attention,
    plot_mean_attention_distance,
    similarity_size,
    plot_position_embedding_similarity,
    filters_size,
    plot_patch_embedding_filters,
    has_rgb_filters,
    check_figure_files,
    inspect_model,
)
