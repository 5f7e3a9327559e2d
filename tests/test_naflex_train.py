"""NaFlex training batches (``vit_common.data.naflex_batches``) and the JAX trainer on them: rows equal to
``vit_common.naflex.preprocess`` bit for bit, padded to the model's patch budget, and one compiled step
for batches of every mix of aspect ratios, equal to the model run on the host's masks and grids."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from PIL import Image

from vit_common.config import ViTConfig
from vit_common.data.augment import Augment
from vit_common.data.datasets import read_dataset
from vit_common.data.images import Preprocess
from vit_common.data.naflex_batches import NaFlexPaddedBatches, NaFlexTransform
from vit_common.naflex import check_weights, position_weights, preprocess
from vit_common.state import random_state
from vit_common.tolerance import compare
from vit_common.training.train_config import TrainConfig

CFG = ViTConfig(
    image_size=32, patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3, class_token=False,
    pool="map", gelu="tanh", posemb_resample="bilinear_aa",
)  # fmt: skip
PP = Preprocess(interpolation="bicubic", max_patches=16)


def test_naflex_rows_are_naflex_preprocess_padded_to_the_budget(tmp_path, naflex_images):
    """Unaugmented, a row's patches are ``preprocess``'s bit for bit; batches of 4 of the 7 images: patches
    [4, 16, 192], position weights float32 of each grid, the last batch's padding row one zero patch of a 1x1
    grid with mask 0 and a zero target. A random crop keeps the crop's aspect ratio within the budget, the
    same for the same generator. Mixup with a NaFlex model is one line naming it."""
    source = read_dataset(naflex_images(tmp_path)).test
    transform = NaFlexTransform(CFG, PP)
    for i in range(len(source)):
        got, grid = transform(source[i]["image"])
        want, want_grid = preprocess(Image.open(source[i]["image"]), 8, 16, 3, PP)
        assert grid == want_grid and np.array_equal(got, want)
    batches = NaFlexPaddedBatches(source, 3, 4, transform)
    assert len(batches) == 2
    last = batches[1]
    assert last["image"].shape == (4, 16, 192) and last["position_weights"].shape == (4, 16, 16)
    weights = position_weights(CFG.grid, last["spatial_shapes"], 16, "bilinear_aa").astype(np.float32)
    assert np.array_equal(last["position_weights"], weights)
    assert np.array_equal(last["mask"], [1, 1, 1, 0]) and not last["target"][3].any()
    assert last["spatial_shapes"][3].tolist() == [1, 1] and last["patch_mask"][3].tolist() == [True] + [False] * 15
    assert np.array_equal(last["patch_mask"].sum(1)[:3], last["spatial_shapes"][:3].prod(1))
    crop = NaFlexTransform(CFG, PP, Augment(crop_scale=0.3, flip=True))
    rows = [crop(source[0]["image"], np.random.default_rng((1, k % 2))) for k in range(3)]
    assert np.array_equal(rows[0][0], rows[2][0]) and all(len(p) == h * w <= 16 for p, (h, w) in rows)
    with pytest.raises(ValueError, match=r"^mixup=0.8, cutmix=0.0, cutmix_minmax=None with a NaFlex model"):
        NaFlexTransform(CFG, PP, Augment(mixup=0.8))


def test_train_iterator_makes_naflex_batches_for_a_naflex_preprocessing(tmp_path, naflex_images):
    """``vit_jax.data.train_iterator`` with a NaFlex preprocessing and the model's config: the batches of
    ``train_batches`` over ``NaFlexTransform``, bit for bit (patches [4, 16, 192], grids within the
    budget); all three NaFlex keys given to the twins' check, one line naming which to pass
    (docs/training.md runs the model on them); without the config, one line asking for it."""
    from vit_jax.data import iterate, train_batches, train_iterator

    data = read_dataset(naflex_images(tmp_path)).fit(CFG.image_size, CFG.in_chans)
    kw = dict(batch_size=4, epochs=1, seed=5)
    got = list(train_iterator(data, preprocess=PP, augment=Augment(flip=True), cfg=CFG, **kw))
    ds = train_batches(data.train, 3, transform=NaFlexTransform(CFG, PP, Augment(flip=True)), **kw)
    want = list(iterate(ds))
    assert len(got) == len(want) == 2 and got[0]["image"].shape == (4, 16, 192)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys() and all(np.array_equal(g[k], w[k]) for k in g)
    naflex = [got[0][k] for k in ("patch_mask", "spatial_shapes", "position_weights")]
    with pytest.raises(ValueError, match=r"expected one: .*; pass patch_mask and position_weights$"):
        check_weights(CFG, got[0]["image"].shape, *naflex)  # the twins' check of such a batch
    with pytest.raises(ValueError, match=r"^max_patches=16 \(a NaFlex preprocessing\) without the model's ViTConfig"):
        train_iterator(data, preprocess=PP, augment=Augment(), **kw)


@pytest.mark.slow
def test_the_jax_trainer_compiles_one_naflex_step_equal_to_the_host_path(tmp_path, naflex_images):
    """The trainer on NaFlex batches (shift and flip augmentation): every training batch holds its images'
    own grids within the budget; two steps run one compiled program; the evaluation step's logits are the
    model's on the host's patch masks and grids (``VisionTransformer(patch_mask=, spatial_shapes=)``),
    within the float32 tolerance."""
    import vit_jax
    from vit_jax.runner import logits
    from vit_jax.trainer import Trainer

    spec = naflex_images(tmp_path)
    data = read_dataset(spec).fit(CFG.image_size, CFG.in_chans)
    tcfg = TrainConfig(dataset=spec, batch_size=4, epochs=1, augment=Augment(shift=2, flip=True))
    state0 = random_state(CFG, seed=3, scale=0.3)
    trainer = Trainer(CFG, tcfg, data, preprocess=PP, weights=state0)
    state = trainer.init_state()
    with trainer.train_iterator() as it:
        batches = list(it)
    assert len(batches) == 2 and all(b["image"].shape == (4, 16, 192) for b in batches)
    grids = np.concatenate([b["spatial_shapes"][b["mask"] > 0] for b in batches])
    assert len(grids) == 7 and grids.prod(1).max() <= 16 and len({tuple(g) for g in grids}) > 2
    for b in batches:
        state, metrics = trainer.train_step(state, b)
        assert np.isfinite(float(metrics["loss"]))
    assert trainer._train_jit._cache_size() == 1
    test = NaFlexPaddedBatches(data.test, 3, 4, NaFlexTransform(CFG, PP))[0]
    got = np.asarray(jax.device_get(trainer.eval_step(state, test))["logits"])
    model = vit_jax.from_numpy(CFG, trainer.weights(state))
    want = next(logits(model, [(test["image"], test["patch_mask"], test["spatial_shapes"])]))
    c = compare("logits", got, want, "tensor", "float32")
    assert c.ok, c
