"""Build hook for the optional compiled walk (gradscope/capture/_cwalk.c).

The metadata is in pyproject.toml.

The extension is optional: when no C compiler or Python headers are available the build goes
on without it and ``gradscope.trace`` uses its pure-Python walker (same results, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("gradscope.capture._cwalk", ["gradscope/capture/_cwalk.c"], optional=True)
    ]
)
