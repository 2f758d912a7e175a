"""Builds hooktrace._C; metadata and tool configuration live in pyproject.toml."""

import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

DEBUG = os.environ.get("DEBUG", "0") == "1"

# No -std flag: torch.utils.cpp_extension adds the standard its headers need
# (C++20 for torch 2.13, whose headers warn under -std=c++17).
extra_compile_args = ["-Wall", "-fvisibility=hidden"]
extra_compile_args += ["-O0", "-g"] if DEBUG else ["-O3"]

setup(
    ext_modules=[
        CppExtension(
            name="hooktrace._C",
            sources=sorted(glob.glob("csrc/*.cpp")),
            extra_compile_args=extra_compile_args,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
