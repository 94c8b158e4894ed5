"""Models written as ordered lists of placeable blocks (MLP, GPT). What the model *is*, not how it is split."""
