"""``data.images``: how image files and arrays become the tensors an image model sees."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.config.choices import ImageNormalize, ImageResize
from memfit.config.fields import doc


@dataclass(frozen=True)
class ImagesConfig:
    size: int | None = doc(
        "Side of the square images the model sees (resized as data.images.resize says); "
        "null keeps each image's own size, which must then be the same for all. Presets "
        "(conv-autoencoder, vit-autoencoder) need it.",
        limits=(1, 2**15), default=None,
    )
    resize: ImageResize = doc(
        "crop (scale the shorter side to size, then cut the centre square) or stretch "
        "(scale both sides to size, ignoring the aspect ratio).",
        default=ImageResize.CROP,
    )
    channels: int = doc("1 (grayscale) or 3 (RGB). An image file of any mode is converted as "
                        "Pillow converts it (L or RGB; alpha dropped; 16-bit gray keeps its "
                        "values); an RGB array becomes gray by the same luma weights.",
                        default=1)
    normalize: ImageNormalize = doc(
        "How intensities reach [0, 1]: auto (unsigned integers divided by their type's "
        "maximum, e.g. 255; float arrays already in [0, 1] kept as they are; anything else "
        "min-max scaled per image) or minmax (every image scaled to span [0, 1]).",
        default=ImageNormalize.AUTO,
    )
    contrast: tuple[str, ...] = doc(
        "Contrast transforms making the model's input, applied in order: gamma:G, invert, "
        "window:LEVEL:WIDTH, stretch[:LOW:HIGH] (percentiles to [0, 1], default 1:99), "
        "noise:SIGMA (Gaussian, seeded per image). Empty: the images as they are.",
        default=(),
    )
    target_contrast: tuple[str, ...] | None = doc(
        "Transforms making the image the model should output, from the same original; null: "
        "the input itself (plain reconstruction). E.g. contrast=[noise:0.1] with "
        "target_contrast=[] trains denoising.",
        default=None,
    )
