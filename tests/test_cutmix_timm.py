"""CutMix and mixup against timm's ``Mixup`` (timm/data/mixup.py), the library whose recipe --recipe timm
follows: the same box for the same draws, the same pasted area on average, the same mirrored pairing,
and in every mode the same batch when both are fed numpy's global draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timm.data.mixup import Mixup, cutmix_bbox_and_lam

from vit_common.data.augment import Augment, cutmix_box


def test_the_box_is_timms_for_the_same_draws():
    """timm draws the centre with np.random.randint(0, H) then (0, W): replay those draws into ours."""
    for k, (h, w) in enumerate([(224, 224), (32, 48), (7, 5)] * 40):
        lam = float(np.random.default_rng(k).beta(1.0, 1.0))
        np.random.seed(k)
        theirs = cutmix_bbox_and_lam((3, h, w), lam, correct_lam=True)
        np.random.seed(k)
        cy, cx = int(np.random.randint(0, h)), int(np.random.randint(0, w))
        box, lam_ours = cutmix_box(h, w, lam, cy, cx)
        assert box == tuple(int(v) for v in theirs[0]) and lam_ours == theirs[1], (h, w, lam)


def test_the_pasted_area_is_timms_on_average():
    """At alpha 1, timm's Mixup pastes 0.309 of a 224 px image on average (the box is clipped at the
    border); ours draws the same distribution (3,000 batches each: standard error about 0.005)."""
    n = 3000
    mix = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, prob=1.0, mode="batch", num_classes=2)
    np.random.seed(0)
    shape = (2, 1, 224, 224)
    theirs = np.mean(
        [1.0 - cutmix_bbox_and_lam(shape, mix._params_per_batch()[0], correct_lam=mix.correct_lam)[1] for _ in range(n)]
    )  # what Mixup._mix_batch pastes, without moving the pixels
    aug, rng = Augment(cutmix=1.0), np.random.default_rng(0)
    image = np.concatenate([np.zeros((1, 224, 224, 1)), np.ones((1, 224, 224, 1))]).astype(np.float32)
    target = np.eye(2, dtype=np.float32)
    ours = np.mean([aug.mix(image, target, 2, rng)[1][0, 1] for _ in range(n)])  # row 0's share of row 1
    assert abs(theirs - 0.309) < 0.015 and abs(ours - theirs) < 0.02, (ours, theirs)


def test_each_image_is_mixed_with_the_mirrored_one_as_timm_pairs_them():
    aug = Augment(mixup=1.0)
    image = np.arange(4, dtype=np.float32).reshape(4, 1, 1, 1) * np.ones((4, 2, 2, 1), np.float32)
    target = np.eye(4, dtype=np.float32)
    mixed, mixed_target = aug.mix(image, target, 4, np.random.default_rng(3))
    lam = mixed_target[0, 0]
    np.testing.assert_allclose(mixed[:, 0, 0, 0], lam * np.arange(4) + (1 - lam) * np.arange(4)[::-1], rtol=1e-6)
    np.testing.assert_allclose(mixed_target, lam * target + (1 - lam) * target[::-1], rtol=1e-6)


class GlobalDraws:
    """The three calls ``Augment.mix`` makes of its generator, answered by numpy's global generator with
    the calls timm's ``Mixup`` makes (``np.random.rand``, ``beta``, ``randint``)."""

    def random(self, size=None):
        return np.random.random_sample(size)

    def beta(self, a, b, size=None):
        return np.random.beta(a, b, size)

    def integers(self, low, high):
        return np.random.randint(low, high)


MIXES = {
    "mixup": dict(mixup=0.8),
    "cutmix": dict(cutmix=1.0),
    "both": dict(mixup=0.8, cutmix=1.0, mixup_switch_prob=0.3),
    "minmax": dict(mixup=0.4, cutmix_minmax=(0.2, 0.8)),
    "uncorrected, half the time": dict(cutmix=0.5, correct_lam=False, mixup_prob=0.5),
}
TIMM_ARGS = dict(mixup="mixup_alpha", cutmix="cutmix_alpha", cutmix_minmax="cutmix_minmax", mixup_prob="prob")
TIMM_ARGS |= dict(mixup_switch_prob="switch_prob", correct_lam="correct_lam")


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
@pytest.mark.parametrize("mix", list(MIXES), ids=list(MIXES))
def test_every_mode_mixes_as_timm_for_the_same_draws(mode, mix):
    """Each mode and setting against timm's ``Mixup`` on 8 seeds, bit for bit: images and targets."""
    aug = Augment(mixup_mode=mode, **MIXES[mix])
    kw = dict(mixup_alpha=0.0, mode=mode, label_smoothing=0.0, num_classes=5)  # timm's mixup_alpha defaults to 1
    timm_mix = Mixup(**kw | {TIMM_ARGS[k]: v for k, v in MIXES[mix].items()})
    for seed in range(8):
        data = np.random.default_rng(seed)
        image = data.standard_normal((6, 7, 9, 3)).astype(np.float32)
        label = data.integers(0, 5, 6)
        np.random.seed(seed)
        x, y = timm_mix(torch.from_numpy(image.transpose(0, 3, 1, 2).copy()), torch.from_numpy(label))
        np.random.seed(seed)
        ours, target = aug.mix(image, np.eye(5, dtype=np.float32)[label], 6, GlobalDraws())
        np.testing.assert_array_equal(ours, x.numpy().transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(target, y.numpy())
