"""Builds the native TCP-analysis kernel next to the pure-Python package.

The kernel is a plain C shared library (no Python API) loaded with ctypes, so it
builds with any C compiler and needs no numpy headers. Everything else lives in
pyproject.toml.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "forensics.native._tcpkernel",
            sources=["forensics/native/tcpkernel.c", "forensics/native/walk.c", "forensics/native/csvfmt.c",
                     "forensics/native/logscan.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
