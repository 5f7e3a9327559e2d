"""What a training run is, framework-free, read by both twins' trainers alike: ``train_config``
(``TrainConfig``, every setting that determines a run's numbers, from which ``vit train``'s flags are
generated; ``RunOptions``, how a run is carried out and recorded) and ``recipes`` (the optimizer recipes
as data: which tensors decay, how the decay is scaled, the moments' dtype, the clip, the schedule in
Python floats, and the translation between recipes) and ``sharding`` (the 2-D device mesh and the
regex rules that split the parameters over it, as text). Read ``recipes`` first: ``train_config`` names a
recipe by its key."""
