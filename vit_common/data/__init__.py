"""Images and datasets, framework-free (numpy + Pillow; a dataset reader imports its format's library
lazily): the one image path (``images``), labelled image sets, batches and augmentation (``datasets``).
Read ``images`` first. The training configuration is ``vit_common.training``."""
