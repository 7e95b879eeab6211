import math


def scale(x, t):
    return x * t


print(scale(2, 3))
