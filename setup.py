"""Build step for the native kernels; everything else is in pyproject.toml.

Both are optional: without a C compiler the build skips them and pure-Python paths do the
same work, to the same results.

- weights/_deltakernel.c (loaded with ctypes by weights/native.py): the delta encoder's
  one-pass sparse diff; without it the encoder's numpy path writes the same bytes.
- topics/_recordreader.c (a CPython extension, used by topics/records.py): a fetched record
  batch's records read in one pass; without it kafka-python reads them record by record.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("astraflow.weights._deltakernel", ["weights/_deltakernel.c"], extra_compile_args=["-O3"], optional=True),
    Extension("astraflow.topics._recordreader", ["topics/_recordreader.c"], extra_compile_args=["-O3"], optional=True),
])
