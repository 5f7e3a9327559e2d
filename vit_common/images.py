"""Image decoding shared by the data pipeline and the CLI (PIL, imported when called)."""

from __future__ import annotations

import numpy as np

# PIL modes holding more than 8 bits per pixel: 16-bit greyscale (PNG, TIFF) opens as 'I;16*' or as
# 32-bit 'I' with values in [0, 65535].
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def to_8bit(image):
    """A PIL image whose pixels PIL's ``convert('L'|'RGB')`` keeps: 16-bit greyscale scaled to 8 bits.

    ``convert`` clips a 16-bit image to 255 instead of scaling it (every non-black pixel turns white), so
    such an image is scaled by 255 / 65535 (rounded, values clipped to [0, 65535]) first; images of
    other modes are returned unchanged.
    """
    if image.mode not in SIXTEEN_BIT_MODES:
        return image
    from PIL import Image

    scaled = np.clip(np.asarray(image, np.float64), 0, 65535) * (255.0 / 65535.0)
    return Image.fromarray(np.rint(scaled).astype(np.uint8))
