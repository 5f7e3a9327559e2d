"""Throughput and MFU of the twins beside timm and Hugging Face, measured interleaved in one run.

``harness`` times contenders (``contenders``) and builds the records; ``report`` prints and writes them;
``peers`` maps a ViTConfig to the peers' constructors; ``gpu_check`` is the one-command GPU run.
Run it as ``vit bench`` (see ``vit_cli/bench.py``).
"""
