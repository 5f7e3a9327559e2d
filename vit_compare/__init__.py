"""Where the twins meet: the code that runs both (or either) and compares them.

``inference`` (one checkpoint in both twins, every intermediate compared), ``training`` (K optimizer
steps of each twin from the same weights, batches and dropout / drop-path masks), ``exports`` (a
trained run's exports in vit_torch and in the libraries that define their formats), ``report`` (the
parity report as PNG and HTML) and ``run_model`` (a checkpoint of any format run on images in the twin
asked for). It sits above the twins: it may import
both twins, and does so inside the functions that run them, so importing a module of it loads no
framework.
"""
