"""The twin runner: either twin's logits and intermediates on the same numpy images, at full precision,
with the frameworks' settings restored afterwards (the commands' old ``torch_logits`` turned TF32 off
for the whole process)."""

from __future__ import annotations

import jax
import numpy as np
import torch

import vit_jax
import vit_jax.runner
import vit_torch
import vit_torch.runner
from vit_common.tolerance import compare


def test_both_runners_give_the_same_intermediates_and_restore_the_settings(random_state, tiny_cfg):
    state = random_state(tiny_cfg, scale=0.2)
    images = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # a user's choice
        with jax.default_matmul_precision("bfloat16"):
            lj, out_j = vit_jax.runner.intermediates(vit_jax.from_numpy(tiny_cfg, state), images)
            lt, out_t = vit_torch.runner.intermediates(vit_torch.from_numpy(tiny_cfg, state), images)
            (logits_t,) = vit_torch.runner.logits(vit_torch.from_numpy(tiny_cfg, state), [images])
            (logits_j,) = vit_jax.runner.logits(vit_jax.from_numpy(tiny_cfg, state), [images])
            assert jax.config.jax_default_matmul_precision == "bfloat16"  # the caller's, back after each
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    assert set(out_j) == set(out_t) and {"patch_embed", "block00", "attn00", "logits"} <= set(out_t)
    for k in out_t:
        assert compare(k, out_j[k], out_t[k], "attention" if k.startswith("attn") else "tensor", "float32").ok, k
    assert compare("logits", lj, lt, "tensor", "float32").ok
    assert compare("logits", logits_j, logits_t, "tensor", "float32").ok  # fused attention: within bounds
    assert compare("logits", logits_t, lt, "tensor", "float32").ok
