"""Build step for the one native kernel; everything else is in pyproject.toml.

The kernel (weights/_deltakernel.c, loaded with ctypes by weights/native.py) is optional:
without a C compiler the build skips it and the delta encoder uses its numpy path, which
writes the same bytes.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("astraflow.weights._deltakernel", ["weights/_deltakernel.c"],
                             extra_compile_args=["-O3"], optional=True)])
