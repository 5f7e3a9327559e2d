"""Images and datasets, framework-free (numpy + Pillow; a dataset reader imports its format's library
lazily): the one image path (``images``), labelled image sets (``datasets``; what a resumed run compares,
``fingerprint``), augmentation (``augment``) and batches (``batches``). Read ``images`` first. The training
configuration is ``vit_common.training``."""
