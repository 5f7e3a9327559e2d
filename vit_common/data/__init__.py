"""Images and datasets, framework-free (numpy + Pillow; a dataset reader imports its format's library
lazily): the one image path (``images``), labelled image sets (``datasets``; what a resumed run compares,
``fingerprint``), augmentation (``augment``), batches (``batches``), and the training configuration both
twins' trainers read (``train_config``). Read ``images`` first."""
