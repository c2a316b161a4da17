"""Build hook: the packages (found, never listed by hand) and the optional compiled walk
(gradscope/graph/_cwalk.c). The metadata is in pyproject.toml.

Every folder of ``gradscope/`` that holds Python files or package data is a package (the page's
assets folder has no ``__init__.py``, so namespace packages are looked for too); ``cli/`` is
installed as ``gradscope_cli`` (a top-level ``cli`` would collide in site-packages).

The extension is optional: when no C compiler or Python headers are available the build goes
on without it and ``gradscope.trace`` uses its pure-Python walker (same results, slower).
"""

from setuptools import Extension, find_namespace_packages, setup

_SKIP = ["*.__pycache__", "*.__pycache__.*", "*.egg-info", "*.egg-info.*"]
PACKAGES = [
    *find_namespace_packages(include=["gradscope", "gradscope.*"], exclude=_SKIP),
    "gradscope_cli",
    *(f"gradscope_cli.{p}" for p in find_namespace_packages("cli", exclude=_SKIP)),
]

setup(
    packages=PACKAGES,
    ext_modules=[
        Extension("gradscope.graph._cwalk", ["gradscope/graph/_cwalk.c"], optional=True)
    ],
)
