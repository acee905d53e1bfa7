"""Synthetic images for trying and testing ``data.format=images`` offline: phantoms in the
manner of Shepp and Logan's head phantom — a bright outer ellipse (the skull), a darker
inner one (the brain) and a few random smaller ellipses of other intensities inside.
"""

from __future__ import annotations

import numpy as np


def random_phantoms(count: int, size: int, seed: int = 0) -> np.ndarray:
    """(count, size, size) float32 images in [0, 1], the same for the same seed."""
    generator = np.random.default_rng(seed)
    # Pixel-centre coordinates in [-1, 1]: (size, size) each.
    ys, xs = np.meshgrid(np.linspace(-1, 1, size), np.linspace(-1, 1, size), indexing="ij")
    images = np.zeros((count, size, size), dtype=np.float32)

    def ellipse(cx: float, cy: float, a: float, b: float, angle: float) -> np.ndarray:
        cos, sin = np.cos(angle), np.sin(angle)
        u, v = (xs - cx) * cos + (ys - cy) * sin, -(xs - cx) * sin + (ys - cy) * cos
        return (u / a) ** 2 + (v / b) ** 2 <= 1

    for image in images:
        a, b = generator.uniform(0.75, 0.92, size=2)
        angle = generator.uniform(-0.3, 0.3)
        image[ellipse(0, 0, a, b, angle)] = generator.uniform(0.75, 0.95)
        image[ellipse(0, 0, a - 0.07, b - 0.08, angle)] = generator.uniform(0.2, 0.35)
        for _ in range(generator.integers(3, 7)):
            cx, cy = generator.uniform(-0.45, 0.45, size=2)
            axes = generator.uniform(0.06, 0.3, size=2)
            image[ellipse(cx, cy, *axes, generator.uniform(0, np.pi))] += generator.uniform(
                -0.15, 0.45)
    return np.clip(images, 0, 1)
