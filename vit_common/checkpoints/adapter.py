"""LoRA adapters as a PEFT folder for the transformers model of a checkpoint's family.

``peft_adapter`` turns a canonical state holding LoRA adapters (``{layer}.lora.lora_a`` (D_in, r) and
``{layer}.lora.lora_b`` (r, D_out), the JAX twin's names, unmerged) into the tensors and the config of a
PEFT LoRA folder (``adapter_config.json`` + ``adapter_model.safetensors``, as ``PeftModel.save_pretrained``
writes them) whose module names are the transformers model's: the rules by which the transformers
writer (``hf``: ViT and DeiT, ``hf_family``: SigLIP, CLIP, DINOv2, ...) writes the layer's weight say
which modules hold it. A layer held by several modules, the fused qkv split into q, k and v, is split
exactly by rows: each module's ``lora_A`` is the shared A^T (r, D_in), its ``lora_B`` its rows of B^T
(D_out, r), so that each module's x W_i^T + s x A B_i is the rows of the fused layer's output. The head,
trained in full, is saved as peft saves ``modules_to_save`` (its own tensors, by the module's names).

Keys are ``base_model.model.{module}.lora_A.weight`` / ``lora_B.weight`` and
``base_model.model.{head module}.weight`` (peft's ``get_peft_model_state_dict`` form); ``target_modules``
lists the modules' full paths, so peft adapts exactly those.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vit_common.checkpoints.formats.rules import Rule
from vit_common.config import ViTConfig
from vit_common.system import io

ADAPTER_LEAVES = ("lora_a", "lora_b")  # vit_jax.lora's adapter tensors' last name part
PEFT_PREFIX = "base_model.model."  # PeftModel's path to the wrapped model
ADAPTER_FOLDER = "adapter_peft"  # the folder a run writes the adapters in
MARK_FILE = "vit_twins.json"  # the folder's list of what it holds (io.folder_mark)


def transformers_rules(
    cfg: ViTConfig, source_format: str | None, spelling: str, model_type: str | None = None
) -> tuple[str, list[Rule]]:
    """(transformers model_type or "vit", the rules of its layout) of the transformers model of the
    source's family: an ``hf_family`` source's own family (``model_type``, the folder's, where it holds
    ``cfg``), an ``hf`` source's ViT, and for any other source the model the transformers writers write
    ``cfg`` as (``hf``'s ViT where it holds it, else ``hf_family``'s ``family_for``). ``spelling``: the
    module names of transformers "v5" (q_proj, k_proj, v_proj, o_proj, mlp.fc1, mlp.fc2) or "v4" (query,
    key, value, attention.output.dense, intermediate.dense, output.dense) where a family has two.

    Raises:
        ValueError: no transformers model holds ``cfg`` (naming what it cannot hold).
    """
    from vit_common.checkpoints.formats.hf import FORMAT as HF
    from vit_common.checkpoints.formats.hf import HfWriteOptions
    from vit_common.checkpoints.formats.hf_families import FORMAT as FAMILIES
    from vit_common.checkpoints.formats.hf_families import family_for

    if source_format != "hf_family" or family_for(cfg, model_type or None) is None:
        model_type = None
    use_hf = source_format == "hf" or (source_format != "hf_family" and not HF.cannot_hold(cfg))
    reasons = HF.cannot_hold(cfg) if use_hf else FAMILIES.cannot_hold(cfg, model_type)
    if reasons:
        raise ValueError(f"no transformers model holds this model for a PEFT adapter: {'; '.join(reasons)}")
    options = HfWriteOptions(spelling=spelling, model_type=model_type)
    if use_hf:
        return "vit", HF.tensor_rules(cfg, options)
    return family_for(cfg, model_type)[0], FAMILIES.tensor_rules(cfg, options)


def installed_transformers() -> str | None:
    """The installed transformers' version (its package metadata: nothing imported), None without it."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def spelling_warning(
    cfg: ViTConfig, source_format: str | None, spelling: str, model_type: str | None = None
) -> str | None:
    """The warning for a folder of ``spelling`` (``transformers_rules``'s arguments) whose module names the
    installed transformers does not have: peft there refuses the folder (``NoMatchingPeftModuleError``:
    its target modules are not in the model). None when the installed transformers spells them so (5.0
    on "v5", before "v4"), when both spellings name this model's modules alike (SigLIP, CLIP), or without
    transformers."""
    version = installed_transformers()
    if version is None:
        return None
    native = "v5" if int(version.split(".")[0]) >= 5 else "v4"
    if native == spelling or transformers_rules(cfg, source_format, native, model_type) == transformers_rules(
        cfg, source_format, spelling, model_type
    ):
        return None
    return (
        f"--export-adapter {spelling}: the installed transformers {version} names this model's modules in its "
        f"{native} spelling, so peft with it refuses the folder (NoMatchingPeftModuleError: target modules "
        f"not found); load it where transformers {'4' if spelling == 'v4' else '5 or later'} is installed, or "
        f"pass --export-adapter {native}"
    )


def _module(piece_key: str, layer: str) -> str:
    if not piece_key.endswith(".weight"):
        raise ValueError(f"{layer}: the transformers layout stores it as {piece_key!r}, not a module's weight")
    return piece_key[: -len(".weight")]


def peft_adapter(
    state: Mapping[str, np.ndarray], rules: list[Rule], *, rank: int, alpha: float, dropout: float = 0.0
) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json's dict, adapter_model.safetensors' tensors) of the adapters in ``state`` and
    its head, for the transformers model that ``rules`` (the transformers writer's ``tensor_rules``)
    lay out. Tensors keep the state's dtype.

    Raises:
        ValueError: ``state`` holds no adapters; an adapted attention projection of a MAP head
            (transformers computes it inside ``nn.MultiheadAttention``) or a layer whose weight the layout
            stores transposed, reshaped or stacked; adapters whose shapes do not fit the rank or the weight.
    """
    by_dst = {r.dst: r for r in rules}
    layers = sorted({k.rsplit(".", 2)[0] for k in state if k.rsplit(".", 1)[-1] in ADAPTER_LEAVES})
    if not layers:
        raise ValueError("no LoRA adapters in the state ({layer}.lora.lora_a / lora_b): nothing to export")
    tensors: dict[str, np.ndarray] = {}
    targets: list[str] = []
    for layer in layers:
        rule = by_dst.get(f"{layer}.weight")
        if rule is None or (layer.startswith("attn_pool.") and not layer.startswith("attn_pool.mlp.")):
            raise ValueError(
                f"{layer}: transformers computes it inside nn.MultiheadAttention, whose projections peft cannot "
                "adapt; leave it out of the LoRA targets (attn.proj names the blocks' projections only)"
            )
        a, b = (np.asarray(state[f"{layer}.lora.{n}"]) for n in ADAPTER_LEAVES)  # (D_in, r), (r, D_out)
        if a.shape[1] != rank or b.shape[0] != rank:
            raise ValueError(f"{layer}: adapters of shapes {a.shape}, {b.shape}: expected rank {rank}")
        row = 0
        for piece in rule.pieces:
            if piece.perm is not None or piece.reshape is not None or piece.layer is not None or len(piece.shape) != 2:
                raise ValueError(f"{layer}: the transformers layout stores {piece.key!r} transformed, not as rows")
            module = _module(piece.key, layer)
            rows = piece.shape[0]
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a.T)  # (r, D_in), shared
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(b.T[row : row + rows])
            targets.append(module)
            row += rows
        if row != b.shape[1]:
            raise ValueError(f"{layer}: lora_b has {b.shape[1]} outputs, the transformers modules {row}")
    saved = []
    for name in ("head.weight", "head.bias"):
        if name in state and name in by_dst:
            (piece,) = by_dst[name].pieces
            tensors[PEFT_PREFIX + piece.key] = np.ascontiguousarray(piece.from_canonical(np.asarray(state[name])))
            saved.append(piece.key.rsplit(".", 1)[0])
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": targets,
        "modules_to_save": sorted(set(saved)) or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "base_model_name_or_path": None,
    }
    return config, tensors


def write_peft_adapter(path: Path, config: dict, tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``peft_adapter``'s result as the folder ``path``, atomically: ``adapter_config.json`` and
    ``adapter_model.safetensors`` (metadata format "pt") as peft writes them, and ``vit_twins.json``
    listing the folder's files (``io.folder_mark``: what lets a later run replace the folder whole; in
    ``adapter_config.json`` the key would make peft warn of an unknown setting)."""

    def write_folder(tmp: Path) -> None:
        names = ["adapter_config.json", "adapter_model.safetensors", MARK_FILE]
        io.write_json(tmp / "adapter_config.json", config, sort_keys=True, mark=False)
        io.write_json(tmp / MARK_FILE, io.folder_mark({}, names), sort_keys=True)
        io.save_safetensors(tmp / "adapter_model.safetensors", dict(tensors), {"format": "pt"})

    io.atomic_write_dir(Path(path), write_folder)
