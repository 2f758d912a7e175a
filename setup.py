"""Builds hooktrace._C; metadata and tool configuration live in pyproject.toml."""

import glob
import os
import re

import torch

from setuptools import setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension

DEBUG = os.environ.get("DEBUG", "0") == "1"
# SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer build for `make sanitize`,
# which builds it in a copy of the tree (see the Makefile). The result only loads with
# libasan preloaded (LD_PRELOAD), so never build it in place for normal use.
SANITIZE = os.environ.get("SANITIZE", "0") == "1"

# No -std flag: torch.utils.cpp_extension adds the standard its headers need
# (C++20 for torch 2.13, whose headers warn under -std=c++17).
extra_compile_args = ["-Wall", "-fvisibility=hidden"]
# The torch the core is built against, kept in it (_C.BUILT_TORCH_VERSION): hooktrace
# refuses to load it into another torch (hooktrace/_native.py). A version is digits,
# letters, dots and "+" (2.13.0+cpu), which the C preprocessor turns into a string as is.
if re.fullmatch(r"[0-9A-Za-z.+]+", torch.__version__):
    extra_compile_args.append(f"-DHOOKTRACE_TORCH_VERSION={torch.__version__}")
extra_link_args: list[str] = []
if SANITIZE:
    # -O1 keeps ASan fast enough for the suite while stack traces stay usable;
    # -fno-sanitize-recover makes every UBSan finding fatal instead of a printed warning.
    sanitize_flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    extra_compile_args += sanitize_flags + ["-fno-omit-frame-pointer", "-g"]
    extra_compile_args += ["-O0"] if DEBUG else ["-O1"]
    extra_link_args += sanitize_flags
else:
    extra_compile_args += ["-O0", "-g"] if DEBUG else ["-O3"]

# The environment switch (HOOKTRACE=1, issue #10) is a .pth file at the top of
# site-packages, which Python runs at startup; its one line costs a dict lookup
# unless the variable is set. Packages cannot place files there, so build_py
# copies it: into the wheel's root for a wheel, and for `pip install -e .` into
# the editable wheel's root (setuptools points `install_lib` there in editable
# mode; build_lib is a throw-away folder then).
AUTOSTART_PTH = "hooktrace-autostart.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.copy_file(AUTOSTART_PTH, os.path.join(target, AUTOSTART_PTH))


setup(
    ext_modules=[
        CppExtension(
            name="hooktrace._C",
            sources=sorted(glob.glob("csrc/*.cpp")),
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True), "build_py": BuildPyWithPth},
)
