"""A small module to try echoline on: colour blending helpers."""


def scale(x, t):
    return x * t


def clamp(value, low=0.0, high=1.0):
    """Keep value inside [low, high]."""
    return max(low, min(high, value))


def lerp(a, b, t):
    """Linear interpolation between a and b by t in [0, 1]."""
    t = clamp(t)
    return a + (b - a) * t


def blend(c1, c2, t):
    """Blend two RGB colours given as (r, g, b) tuples."""
    return tuple(lerp(x, y, t) for x, y in zip(c1, c2, strict=True))
