"""The `vit` command. Each subcommand is a small module exposing ``add_parser(subparsers)`` and
``run(args) -> int``; heavy imports (jax, torch) happen inside ``run`` so that a subcommand pays only
for the twin(s) it uses."""
