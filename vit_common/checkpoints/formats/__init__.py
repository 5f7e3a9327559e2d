"""Checkpoint formats, one module and one ``Format`` object (``FORMAT``) each, on shared modules:

- ``errors``: ``FormatError``;
- ``rules``: the mapping rules between file tensors and the canonical state, what a layout cannot hold;
- ``provenance``: where each config field came from, config inference from tensor shapes, the report;
- ``protocol``: the ``Format`` interface and what flows through it (``Source``, ``Decoded``, ``Encoded``,
  ``ReadOptions``, ``WriteOptions``);
- ``tensors``: ``LazyTensor`` and ``TensorMap``, how tensors stream from a reader to a writer;
- ``source``: containers on disk (safetensors, .npz, torch pickles, HF and orbax folders);
- ``stored_config``: a ViTConfig stored beside the tensors.

A large format keeps its parts in helper modules beside it, which hold no ``FORMAT``: ``timm_state``
(timm state_dicts; timm's model for a config) and ``timm_hub`` (timm hub folders) for ``timm``;
``hf_vit`` (ViT and DeiT folders) for ``hf``; ``hf_common`` (key spellings, activation names) for ``hf``
and ``hf_families``. ``hf_families`` is a package: its ``FORMAT`` in ``__init__``, one module per family.

The registry of these objects is ``vit_common.checkpoints.registry``; nothing here imports it.
"""
