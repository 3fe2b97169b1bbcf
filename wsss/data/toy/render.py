"""Drawing one toy sample: shapes, fills, colours, distractors, background and the label maps.

What the samples show and how the versions differ: :mod:`wsss.data.toy.dataset` (which writes them as a VOC-layout
dataset) and ``docs/toy_dataset.md`` (design and history, with numbers). Drawing is deterministic in its
``numpy.random.Generator`` and takes about 25 ms per image. cv2 is imported by the three functions that draw
with it, so that the constants below load without it (``tools/make_toy_voc.py --help`` answers at once).
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TOY_CLASSES = ("background", "disc", "ring", "triangle", "cross", "star", "striped_square")
TOY_VERSIONS = (2, 3)
"""Generator versions (see the module docstring). Add one whenever the generated images change: the
version is recorded in ``toy_meta.json``, so a cached set of another version regenerates."""
DEFAULT_TOY_VERSION = 2

IGNORE_INDEX = 255

PLAIN_TEXTURES = ("solid", "gradient")
PATTERNED_TEXTURES = ("speckle", "stripes", "checker", "dots")
TEXTURES = PLAIN_TEXTURES + PATTERNED_TEXTURES
CLASS_TEXTURES = {
    "disc": "speckle",
    "ring": "solid",
    "triangle": "checker",
    "cross": "dots",
    "star": "gradient",
    "striped_square": "stripes",
}
"""Each class has its own fill. Distractors are plain (solid or gradient), or in version 3 sometimes
patterned like a class."""
CLASS_HUES = {name: k / 6.0 for k, name in enumerate(CLASS_TEXTURES)}
"""Version 2: each class has its own hue (HSV, in [0, 1)); objects are vivid, background and distractors
muted."""

_SIDE_RANGE = (160, 320)
_MIN_ASPECT_GAP = 24  # px: |W - H| at least this, so no image is (nearly) square
_NUM_OBJECTS_P = (0.45, 0.35, 0.20)  # 1, 2, 3 objects
_OBJECT_DIAMETER = (0.28, 0.50)  # fraction of the short side
_TINY_DIAMETER = (0.12, 0.17)
_TINY_P = 0.06
_MIN_VISIBLE = 0.25  # visible / in-frame area of each object
_DIFFICULT_VISIBLE = 0.40
_MIN_INTERIOR_PX = 40  # labelled pixels left once the ignore band is cut out
_BAND_RADIUS = 2  # ignore band: pixels within 2 px (Chebyshev) of another instance
_VALUE_RANGE = (0.25, 0.9)  # HSV value of background and distractor colours (and of every colour in v3)
_HUE_JITTER = 0.025  # v2: +- around the class hue: classes stay 0.12 apart on the hue circle
_MUTED_SATURATION = 0.3  # v2: background and distractor colours; objects have saturation >= 0.75
_DISTINCT_TRIES = 30  # draws to find a colour that differs from given ones in brightness
_DISTINCT_RGB, _DISTINCT_LUMA = 90.0, 50.0  # "differs": this far apart in RGB and in luma
_LUMA = np.asarray([0.299, 0.587, 0.114], dtype=np.float32)
_NUM_DISTRACTORS = (1, 4)
_BACKGROUND_GRAIN = (3.0, 8.0)  # amplitude of the 4-10 px background noise
_SUPERSAMPLE = 4
"""Per-image folders the generator writes (toy ids only)."""


@dataclass
class ToyObject:
    """One annotated instance. ``bbox`` is VOC style: 1-based inclusive (xmin, ymin, xmax, ymax)."""

    name: str
    bbox: tuple[int, int, int, int]
    difficult: bool
    truncated: bool
    occluded: bool


@dataclass
class ToySample:
    """One generated image: ``image`` (H, W, 3) uint8 RGB, ``mask`` (H, W) uint8 class indices or 255."""

    image: np.ndarray
    mask: np.ndarray
    objects: list[ToyObject]


@dataclass
class _Shape:
    cls: int  # class index; 0 for a distractor
    center: tuple[float, float]
    radius: float
    angle: float
    tiny: bool
    alpha: np.ndarray  # (H, W) float32 coverage in [0, 1]
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive) of the in-frame coverage
    truncated: bool


# ---------------------------------------------------------------------------------------------------------
# Geometry: every shape is a list of (polygon, fill) drawn in order; fill 0 cuts holes.


def _circle(r: float, n: int = 96) -> np.ndarray:
    t = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
    return np.stack([r * np.cos(t), r * np.sin(t)], axis=1)


def _regular_star(points: int, inner: float) -> np.ndarray:
    t = np.pi / 2 + np.arange(2 * points) * np.pi / points
    r = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return np.stack([r * np.cos(t), -r * np.sin(t)], axis=1)


def _class_polygons(name: str, rng: np.random.Generator) -> list[tuple[np.ndarray, int]]:
    """Unit-radius polygons of a class, centred on the origin, before rotation."""
    if name == "disc":
        return [(_circle(1.0), 1)]
    if name == "ring":
        return [(_circle(1.0), 1), (_circle(rng.uniform(0.45, 0.6)), 0)]
    if name == "triangle":
        t = np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        return [(np.stack([np.cos(t), -np.sin(t)], axis=1), 1)]
    if name == "cross":
        w = rng.uniform(0.28, 0.36)
        pts = [(w, 1), (w, w), (1, w), (1, -w), (w, -w), (w, -1), (-w, -1), (-w, -w), (-1, -w), (-1, w),
               (-w, w), (-w, 1)]  # fmt: skip
        return [(np.asarray(pts, dtype=np.float64), 1)]
    if name == "star":
        return [(_regular_star(5, rng.uniform(0.42, 0.5)), 1)]
    if name == "striped_square":
        s = 0.8
        return [(np.asarray([(-s, -s), (s, -s), (s, s), (-s, s)], dtype=np.float64), 1)]
    raise ValueError(f"unknown toy class {name!r}; expected one of {TOY_CLASSES[1:]}")


def _distractor_polygons(kind: str, rng: np.random.Generator) -> list[tuple[np.ndarray, int]]:
    """Unit-radius polygons of a background shape that is none of the classes."""
    if kind == "blob":
        n = 48
        t = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
        r = np.ones(n)
        for k in (2, 3, 4):
            r += rng.uniform(0.08, 0.25) * np.cos(k * t + rng.uniform(0, 2 * np.pi))
        r /= r.max()
        return [(np.stack([r * np.cos(t), r * np.sin(t)], axis=1), 1)]
    if kind == "bar":
        h = 1.0 / rng.uniform(3.0, 6.0)
        return [(np.asarray([(-1, -h), (1, -h), (1, h), (-1, h)], dtype=np.float64), 1)]
    if kind == "ellipse":
        c = _circle(1.0)
        c[:, 1] /= rng.uniform(1.8, 3.0)
        return [(c, 1)]
    if kind == "rectangle":  # never near-square and never striped: a square needs stripes to be a class
        h = 1.0 / rng.uniform(1.5, 2.5)
        return [(np.asarray([(-0.8, -0.8 * h), (0.8, -0.8 * h), (0.8, 0.8 * h), (-0.8, 0.8 * h)]), 1)]
    if kind == "line":
        h = 0.03
        return [(np.asarray([(-1, -h), (1, -h), (1, h), (-1, h)], dtype=np.float64), 1)]
    if kind == "dots":
        polys = []
        for _ in range(int(rng.integers(4, 9))):
            c = rng.uniform(-0.8, 0.8, size=2)
            polys.append((_circle(rng.uniform(0.08, 0.16), 24) + c, 1))
        return polys
    raise ValueError(f"unknown distractor kind {kind!r}")


_DISTRACTOR_KINDS = ("blob", "bar", "ellipse", "rectangle", "line", "dots")


def _rasterize(
    polygons: list[tuple[np.ndarray, int]],
    center: tuple[float, float],
    radius: float,
    angle: float,
    height: int,
    width: int,
) -> tuple[np.ndarray, tuple[int, int, int, int], bool]:
    """Anti-aliased coverage (H, W) of rotated, scaled polygons; also the in-frame box and truncation."""
    import cv2

    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    placed = [(p @ rot.T * radius + np.asarray(center), v) for p, v in polygons]
    allpts = np.concatenate([p for p, _ in placed])
    lo, hi = allpts.min(axis=0), allpts.max(axis=0)
    truncated = bool(lo[0] < 0 or lo[1] < 0 or hi[0] > width or hi[1] > height)
    x0, y0 = max(int(np.floor(lo[0])), 0), max(int(np.floor(lo[1])), 0)
    x1, y1 = min(int(np.ceil(hi[0])) + 1, width), min(int(np.ceil(hi[1])) + 1, height)
    alpha = np.zeros((height, width), np.float32)
    if x1 <= x0 or y1 <= y0:
        return alpha, (0, 0, 0, 0), truncated
    s = _SUPERSAMPLE
    canvas = np.zeros(((y1 - y0) * s, (x1 - x0) * s), np.uint8)
    for pts, value in placed:
        q = np.round((pts - (x0, y0)) * s - 0.5).astype(np.int32)
        cv2.fillPoly(canvas, [q], 255 if value else 0)
    alpha[y0:y1, x0:x1] = cv2.resize(canvas, (x1 - x0, y1 - y0), interpolation=cv2.INTER_AREA) / 255.0
    return alpha, (x0, y0, x1, y1), truncated


# ---------------------------------------------------------------------------------------------------------
# Appearance: colours, fills, background


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.asarray(colorsys.hsv_to_rgb(h, s, v), dtype=np.float32) * 255.0


def _muted_colour(rng: np.random.Generator) -> np.ndarray:
    """Version 2's background and distractor colour: any hue, low saturation."""
    return _hsv(rng.uniform(0.0, 1.0), rng.uniform(0.0, _MUTED_SATURATION), rng.uniform(*_VALUE_RANGE))


def _any_colour(rng: np.random.Generator) -> np.ndarray:
    """Version 3's one colour distribution for objects, distractors and background: any hue, vivid or muted."""
    return _hsv(rng.uniform(0.0, 1.0), rng.uniform(0.0, 1.0), rng.uniform(*_VALUE_RANGE))


def _distinct_colour(
    rng: np.random.Generator, draw: Callable[[np.random.Generator], np.ndarray], avoid: tuple[np.ndarray, ...]
) -> np.ndarray:
    """A colour from ``draw`` that differs from each colour in ``avoid`` in brightness, not only in hue
    (best of :data:`_DISTINCT_TRIES` draws).

    JPEG keeps colour at half resolution, so stripes and speckles that differ only in hue would fade.
    """
    best, best_score = None, -1.0
    for _ in range(_DISTINCT_TRIES):
        c = draw(rng)
        score = min(
            min(float(np.linalg.norm(c - a)) / _DISTINCT_RGB, abs(float(_LUMA @ (c - a))) / _DISTINCT_LUMA)
            for a in avoid
        )
        if score > best_score:
            best, best_score = c, score
        if score >= 1.0:
            break
    return best


def _class_hue_colours(rng: np.random.Generator, cls: int, beneath: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Version 2's two fill colours, ``beneath`` unused: a distractor's (``cls`` 0) are muted; an object's
    are its class hue, vivid, one bright and one dark."""
    if cls == 0:
        first = _muted_colour(rng)
        return first, _distinct_colour(rng, _muted_colour, (first,))
    hue = (CLASS_HUES[TOY_CLASSES[cls]] + rng.uniform(-_HUE_JITTER, _HUE_JITTER)) % 1.0
    bright = _hsv(hue, rng.uniform(0.75, 1.0), rng.uniform(0.8, 1.0))
    dark = _hsv(hue, rng.uniform(0.75, 1.0), rng.uniform(0.3, 0.45))
    return bright, dark


def _shared_colours(rng: np.random.Generator, cls: int, beneath: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Version 3's two fill colours, the same for every class and the distractors (``cls`` unused): two
    :func:`_any_colour` colours that differ from each other and from ``beneath`` (the mean colour under
    the shape, so the shape stays visible), in random order (a plain fill shows either one)."""
    first = _distinct_colour(rng, _any_colour, (beneath,))
    second = _distinct_colour(rng, _any_colour, (first, beneath))
    return (first, second) if rng.random() < 0.5 else (second, first)


@dataclass(frozen=True)
class _Appearance:
    """What a version draws its own way; shapes, layout, fills, noise and labels are shared."""

    background_colour: Callable[[np.random.Generator], np.ndarray]
    fill_colours: Callable[[np.random.Generator, int, np.ndarray], tuple[np.ndarray, np.ndarray]]
    """(rng, class index or 0 for a distractor, mean colour beneath the shape) -> the fill's two colours."""
    borrowed_fill_p: float
    """Chance that a distractor wears a class's patterned fill instead of a plain one."""


_APPEARANCES = {
    2: _Appearance(_muted_colour, _class_hue_colours, borrowed_fill_p=0.0),
    3: _Appearance(_any_colour, _shared_colours, borrowed_fill_p=0.25),
}


def check_version(version: int) -> None:
    """Raise ValueError unless ``version`` is one of :data:`TOY_VERSIONS`."""
    if version not in _APPEARANCES:
        raise ValueError(f"unknown toy set version {version!r}; expected one of {TOY_VERSIONS}")


def _appearance(version: int) -> _Appearance:
    check_version(version)
    return _APPEARANCES[version]


def _smooth_noise(rng: np.random.Generator, height: int, width: int, cell: float) -> np.ndarray:
    """(H, W) float32 noise with unit-ish amplitude and features about ``cell`` px large."""
    import cv2

    gh, gw = int(np.ceil(height / cell)) + 2, int(np.ceil(width / cell)) + 2
    grid = rng.standard_normal((gh, gw)).astype(np.float32)
    big = cv2.resize(grid, (int(gw * cell), int(gh * cell)), interpolation=cv2.INTER_CUBIC)
    oy, ox = int(rng.integers(0, int(cell) + 1)), int(rng.integers(0, int(cell) + 1))
    return big[oy : oy + height, ox : ox + width]


def _background(
    rng: np.random.Generator, height: int, width: int, colour: Callable[[np.random.Generator], np.ndarray]
) -> np.ndarray:
    """(H, W, 3) float32: a gradient between two ``colour`` draws plus low and mid frequency noise."""
    c0, c1 = colour(rng), colour(rng)
    theta = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    proj = xx * np.cos(theta) + yy * np.sin(theta)
    t = ((proj - proj.min()) / max(float(np.ptp(proj)), 1.0))[..., None]
    img = c0 * (1 - t) + c1 * t
    low = np.stack([_smooth_noise(rng, height, width, rng.uniform(40, 90)) for _ in range(3)], axis=-1)
    mid = _smooth_noise(rng, height, width, rng.uniform(4, 10))[..., None]
    return img + 25.0 * low + rng.uniform(*_BACKGROUND_GRAIN) * mid


def _texture(
    rng: np.random.Generator,
    kind: str,
    colours: tuple[np.ndarray, np.ndarray],
    box: tuple[int, int, int, int],
    center: tuple[float, float],
    angle: float,
) -> np.ndarray:
    """(h, w, 3) float32 fill of the box in one of :data:`TEXTURES`; patterns turn with ``angle``."""
    x0, y0, x1, y1 = box
    h, w = y1 - y0, x1 - x0
    a, b = colours
    if kind == "solid":
        return np.broadcast_to(a, (h, w, 3)) + 5.0 * rng.standard_normal((h, w, 1)).astype(np.float32)
    if kind == "speckle":
        t = np.clip(_smooth_noise(rng, h, w, rng.uniform(3.0, 5.0)) * 2.0, 0, 1)[..., None]
        return a * (1 - t) + b * t
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    if kind == "gradient":
        theta = rng.uniform(0, 2 * np.pi)
        proj = xx * np.cos(theta) + yy * np.sin(theta)
        t = ((proj - proj.min()) / max(float(np.ptp(proj)), 1.0))[..., None]
        return a * (1 - t) + (a * 0.6 + b * 0.4) * t
    # periodic patterns in object coordinates (u along the object's rotated x axis)
    u = (xx - center[0]) * np.cos(angle) + (yy - center[1]) * np.sin(angle)
    v = -(xx - center[0]) * np.sin(angle) + (yy - center[1]) * np.cos(angle)
    if kind == "stripes":
        period = rng.uniform(6.0, 10.0)
        wave = np.sin(2 * np.pi * u / period + rng.uniform(0, 2 * np.pi))
    elif kind == "checker":
        period = rng.uniform(10.0, 14.0)  # two cells per period
        wave = np.sin(2 * np.pi * u / period) * np.sin(2 * np.pi * v / period) * 2.0
    elif kind == "dots":
        period = rng.uniform(8.0, 11.0)
        du = (u / period + 0.5) % 1.0 - 0.5
        dv = (v / period + 0.5) % 1.0 - 0.5
        wave = (0.3 - np.sqrt(du**2 + dv**2)) * 8.0  # disc of radius 0.3 period
    else:
        raise ValueError(f"unknown texture {kind!r}; expected one of {TEXTURES}")
    t = np.clip(0.5 + 2.0 * wave, 0, 1)[..., None]
    return a * (1 - t) + b * t


def _composite(img: np.ndarray, alpha: np.ndarray, box: tuple[int, int, int, int], fill: np.ndarray) -> None:
    x0, y0, x1, y1 = box
    a = alpha[y0:y1, x0:x1, None]
    img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * (1 - a) + fill * a


# ---------------------------------------------------------------------------------------------------------
# One sample


def _ignore_band(instances: np.ndarray, radius: int = _BAND_RADIUS) -> np.ndarray:
    """(H, W) bool: pixels within ``radius`` px of a pixel of another instance (background included)."""
    import cv2

    kernel = np.ones((2 * radius + 1, 2 * radius + 1), np.uint8)
    inst = instances.astype(np.uint8)
    return cv2.dilate(inst, kernel) != cv2.erode(inst, kernel)


def _image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width), each in :data:`_SIDE_RANGE`, never (nearly) square."""
    while True:
        width, height = (int(v) for v in rng.integers(_SIDE_RANGE[0], _SIDE_RANGE[1] + 1, size=2))
        if abs(width - height) >= _MIN_ASPECT_GAP:
            return height, width


def _layout(rng: np.random.Generator, height: int, width: int) -> tuple[list[_Shape], np.ndarray]:
    """Objects (in drawing order) and their instance map (H, W) int (0 = background, k = object k-1).

    Resamples until every object keeps enough visible pixels outside the ignore band; drops an object
    after repeated failures, never below one.
    """
    short = min(height, width)
    n = int(rng.choice(len(_NUM_OBJECTS_P), p=_NUM_OBJECTS_P)) + 1
    for attempt in range(200):
        if attempt and attempt % 50 == 0 and n > 1:
            n -= 1
        shapes = []
        for _ in range(n):
            cls = int(rng.integers(1, len(TOY_CLASSES)))
            tiny = bool(rng.random() < _TINY_P)
            radius = 0.5 * short * rng.uniform(*(_TINY_DIAMETER if tiny else _OBJECT_DIAMETER))
            cx = rng.uniform(0.5 * radius, width - 0.5 * radius)
            cy = rng.uniform(0.5 * radius, height - 0.5 * radius)
            angle = rng.uniform(0, 2 * np.pi)
            polys = _class_polygons(TOY_CLASSES[cls], rng)
            alpha, box, truncated = _rasterize(polys, (cx, cy), radius, angle, height, width)
            shapes.append(_Shape(cls, (cx, cy), radius, angle, tiny, alpha, box, truncated))
        instances = np.zeros((height, width), np.int32)
        for k, s in enumerate(shapes):
            instances[s.alpha >= 0.5] = k + 1
        band = _ignore_band(instances)
        ok = True
        for k, s in enumerate(shapes):
            full = int((s.alpha >= 0.5).sum())
            visible = instances == k + 1
            if full == 0 or visible.sum() < _MIN_VISIBLE * full or (visible & ~band).sum() < _MIN_INTERIOR_PX:
                ok = False
                break
        if ok:
            return shapes, instances
    raise RuntimeError("could not place objects; image too small for the object sizes")


def _distractor_texture(rng: np.random.Generator, borrowed_fill_p: float) -> str:
    """A plain fill, or with probability ``borrowed_fill_p`` one of the classes' patterned fills."""
    if borrowed_fill_p > 0 and rng.random() < borrowed_fill_p:
        return PATTERNED_TEXTURES[int(rng.integers(len(PATTERNED_TEXTURES)))]
    return PLAIN_TEXTURES[int(rng.integers(len(PLAIN_TEXTURES)))]


def _paint(rng: np.random.Generator, img: np.ndarray, look: _Appearance, shape: _Shape, texture: str) -> None:
    """Composite ``shape`` into ``img`` (H, W, 3) float32 in place, filled with ``texture`` in the
    version's colours."""
    x0, y0, x1, y1 = shape.box
    a = shape.alpha[y0:y1, x0:x1, None]
    beneath = (img[y0:y1, x0:x1] * a).sum(axis=(0, 1)) / max(float(a.sum()), 1e-6)
    colours = look.fill_colours(rng, shape.cls, beneath)
    _composite(img, shape.alpha, shape.box, _texture(rng, texture, colours, shape.box, shape.center, shape.angle))


def _draw_distractors(rng: np.random.Generator, img: np.ndarray, look: _Appearance) -> None:
    """Paint 1-4 shapes of no class (``cls`` 0) into ``img`` (H, W, 3) float32, in place."""
    height, width = img.shape[:2]
    short = min(height, width)
    for _ in range(int(rng.integers(_NUM_DISTRACTORS[0], _NUM_DISTRACTORS[1] + 1))):
        kind = _DISTRACTOR_KINDS[int(rng.integers(len(_DISTRACTOR_KINDS)))]
        radius = 0.5 * short * rng.uniform(0.12, 0.4 if kind not in ("line", "bar") else 0.7)
        center = (rng.uniform(0, width), rng.uniform(0, height))
        angle = rng.uniform(0, 2 * np.pi)
        alpha, box, truncated = _rasterize(_distractor_polygons(kind, rng), center, radius, angle, height, width)
        if box[2] <= box[0] or box[3] <= box[1]:
            continue
        shape = _Shape(0, center, radius, angle, False, alpha, box, truncated)
        _paint(rng, img, look, shape, _distractor_texture(rng, look.borrowed_fill_p))


def _lit(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    """The final (H, W, 3) uint8 image: ``img`` under a smooth lighting field, plus pixel noise."""
    height, width = img.shape[:2]
    light = 1.0 + 0.12 * _smooth_noise(rng, height, width, rng.uniform(80, 160))
    img = img * light[..., None] + 4.0 * rng.standard_normal((height, width, 1)).astype(np.float32)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def _annotate(shapes: list[_Shape], instances: np.ndarray) -> tuple[np.ndarray, list[ToyObject]]:
    """The class mask (H, W) uint8 with its ignore band, and the objects of ``shapes``."""
    classes = np.asarray([0] + [s.cls for s in shapes], dtype=np.uint8)
    mask = classes[instances]
    mask[_ignore_band(instances)] = IGNORE_INDEX
    objects = []
    for k, s in enumerate(shapes):
        ys, xs = np.nonzero(instances == k + 1)
        visible_frac = len(xs) / int((s.alpha >= 0.5).sum())
        objects.append(ToyObject(
            name=TOY_CLASSES[s.cls],
            bbox=(int(xs.min()) + 1, int(ys.min()) + 1, int(xs.max()) + 1, int(ys.max()) + 1),
            difficult=s.tiny or visible_frac < _DIFFICULT_VISIBLE,
            truncated=s.truncated,
            occluded=visible_frac < 0.95,
        ))  # fmt: skip
    return mask, objects


def generate_sample(rng: np.random.Generator, version: int = DEFAULT_TOY_VERSION) -> ToySample:
    """Draw one image, its mask and its objects from ``rng``, in the look of toy set ``version``.

    Returns:
        The image (H, W, 3) uint8, the mask (H, W) uint8 with values in {0..len(TOY_CLASSES)-1, 255},
        and the objects in drawing order (later ones occlude earlier ones).

    Raises:
        ValueError: ``version`` is not one of :data:`TOY_VERSIONS`.
    """
    look = _appearance(version)
    height, width = _image_size(rng)
    img = _background(rng, height, width, look.background_colour)
    _draw_distractors(rng, img, look)
    shapes, instances = _layout(rng, height, width)
    for s in shapes:
        _paint(rng, img, look, s, CLASS_TEXTURES[TOY_CLASSES[s.cls]])
    image = _lit(rng, img)
    mask, objects = _annotate(shapes, instances)
    return ToySample(image=image, mask=mask, objects=objects)
