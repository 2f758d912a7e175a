"""Kernel marks: per-module time inside torch.compile regions (issue #18).

A compiled region runs generated kernels, not module calls, so module spans stop at
the region. While a recording is active, each region torch.compile generates gets
marks around every kernel call of its Python wrapper (Inductor's CPU backend)::

    _ht_kb(17)                                   # kernel_begin(site 17)
    extern_kernels.addmm(primals_2, buf0, ...)   # the kernel, unchanged
    _ht_ke(17)                                   # kernel_end(site 17)

(csrc/kernel_marks.h records them natively). A *site* is one kernel call in one
generated graph: the kernel's name, the module whose ops it runs and the phase
(forward or backward graph). The reader (hooktrace.analysis.kernels) attributes each
kernel's measured time to that module, under the module span (forward) or the
autograd node (backward) that ran the region.

**Which module a kernel belongs to.** Every FX node that Inductor fused into the
kernel carries ``nn_module_stack`` (forward graph) or ``fwd_nn_module_stack``
(AOTAutograd's backward graph: the forward node a gradient node came from). An
extern kernel (mm, addmm, convolution, SDPA, a collective) implements one node,
its ``origin_node``: that node's innermost module. A fused kernel goes to the
*nearest common ancestor* of the innermost modules of its compute nodes, ignoring
pure view ops (view, permute, reshape...: they fold into indexing and do no work of
their own); nodes without a module stack belong to the region's own module. Why an
ancestor and not a split: the time of one fused loop is not separable by op from
its measurement; a split by op count would be an estimate presented as a
measurement. Fusion across modules is common in backward (one kernel computes
GELU's and LayerNorm's gradients), so the parent row holds that time.

**What is touched.** Only graphs compiled while a recording is active (the
compile-start/-end callbacks of record/dispatch.py turn the marks on for that
compile): code compiled before keeps its code (no recompile), and its region stays
one span. Marked code stays in Inductor's FX graph cache and AOTAutograd's cache
under keys of its own: while marking, a no-op post-grad pass (:func:`_mark_pass`,
whose ``uuid()`` is a hash of this file) is added to
``torch._inductor.config.post_grad_custom_post_pass``, which enters both caches' keys;
so a marked compile never gets unmarked code nor the reverse, and each hits its own
entries (a second ``hooktrace run`` of a script recompiles nothing). The generated
module registers its sites when it is loaded (``_ht_3 = _ht_site("cpp_fused_0",
"blocks.0", "forward")`` at its top, ``_ht_kb(_ht_3)`` per call), so code loaded from
the cache by another process names its kernels in that process's site table. Marked
code run with no recording active costs two C calls per kernel that record nothing. Not marked: ``cpp_wrapper`` mode (no Python wrapper)
and GPU (triton) kernels, which hooktrace.merge attributes from the profiler.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["MODULE_SITE", "compile_started", "compile_ended", "sites", "site_count", "installed", "site"]

_lock = threading.Lock()
# The kernel name of a site that names a module of a compiled graph, not a kernel: no
# mark carries its id; the reader (hooktrace.analysis.kernels.fused_modules) lists these modules.
MODULE_SITE = ""
# The process-wide site table: [kernel name, module path relative to the compiled
# region's root module ("" = the root), "forward" | "backward"]; a site's id is its
# index, baked into the generated code, so the table only grows.
_sites: list[list[str]] = []
_site_ids: dict[tuple[str, str, str], int] = {}
_marking = 0  # compiles in progress that mark (nested compiles possible)
_installed = False
_MARKED = "_hooktrace_marks"  # attribute set on a wrapper whose imports name the marks

# View-like ops fold into a kernel's indexing: they do no work of their own.
_VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand", "squeeze",
    "unsqueeze", "slice", "select", "as_strided", "alias", "detach", "getitem",
    "view_as", "unflatten", "flatten", "split", "split_with_sizes", "unbind", "narrow",
})
_PATH_PART = re.compile(r"""\.(\w+)|\[(\d+)\]|\[['"]([^'"]+)['"]\]""")


def sites() -> list[list[str]]:
    """A copy of the site table (what a trace stores as ``info["kernel_sites"]``)."""
    with _lock:
        return [list(s) for s in _sites]


def site_count() -> int:
    return len(_sites)


def site(kernel_name: str, module: str, phase: str) -> int:
    """The id of a site, registered on first use; called by marked generated code when
    it is loaded (compiled now, or loaded from Inductor's cache by a later process)."""
    key = (str(kernel_name), str(module), str(phase))
    with _lock:
        found = _site_ids.get(key)
        if found is None:
            _sites.append(list(key))
            found = _site_ids[key] = len(_sites) - 1
        return found


def installed() -> bool:
    """Whether Inductor's code generation was patched (the first marking compile)."""
    return _installed


def compile_started() -> None:
    """A compile starts while a recording is active: mark the kernels it generates."""
    global _marking
    with _lock:
        if not _install():
            return
        if _marking == 0:
            _key_caches()
        _marking += 1


def compile_ended() -> None:
    global _marking
    with _lock:
        if _marking == 0:
            return
        _marking -= 1
        if _marking == 0:
            _restore_config()


# -- the patches ---------------------------------------------------------------------

def _install() -> bool:
    """Patch Inductor's CPU code generation once; False when this torch lacks the
    places patched (then nothing is marked and regions stay one span)."""
    global _installed
    if _installed:
        return True
    try:
        from torch._inductor.codegen.cpp import KernelGroup
        from torch._inductor.scheduler import Scheduler
    except Exception:  # no Inductor, or moved: regions stay one span
        return False
    if not (callable(getattr(KernelGroup, "call_kernel", None))
            and callable(getattr(Scheduler, "codegen_extern_call", None))):
        return False
    original_call = KernelGroup.call_kernel
    original_extern = Scheduler.codegen_extern_call

    def call_kernel(self: Any, wrapper: Any, kernel_name: str) -> Any:
        if not _marking:
            return original_call(self, wrapper, kernel_name)
        nodes = [n for sn in self.scheduled_nodes for n in _origins_of(sn)]
        site = _begin(wrapper, kernel_name, nodes, None)
        out = original_call(self, wrapper, kernel_name)
        _end(wrapper, site)
        return out

    def codegen_extern_call(self: Any, scheduler_node: Any) -> Any:
        if not _marking:
            return original_extern(self, scheduler_node)
        from torch._inductor.virtualized import V

        wrapper = V.graph.wrapper_code
        node = scheduler_node.node
        name = (getattr(node, "python_kernel_name", None) or type(node).__name__)
        site = _begin(wrapper, str(name), list(getattr(node, "origins", ()) or ()),
                      getattr(node, "origin_node", None))
        out = original_extern(self, scheduler_node)
        _end(wrapper, site)
        return out

    KernelGroup.call_kernel = call_kernel  # type: ignore[method-assign]
    Scheduler.codegen_extern_call = codegen_extern_call  # type: ignore[method-assign]
    _key_module_paths()
    _installed = True
    return True


def _key_module_paths() -> None:
    """The sites baked into marked code name modules (``nn_module_stack``), which the
    caches' graph hash leaves out: two models with the same ops under other module names
    would share marked code, and the second's kernels would carry the first's names.
    While marking, each graph's module paths join its key (``FxGraphHashDetails``, whose
    fields are the FX graph cache key, and which AOTAutograd's cache key extends). If
    this torch lacks it, marked code is not cached."""
    try:
        from torch._inductor.codecache import FxGraphHashDetails
    except Exception:
        _no_cache.append(True)
        return
    original_init = FxGraphHashDetails.__init__

    def __init__(self: Any, gm: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, gm, *args, **kwargs)
        if _marking:
            graph = getattr(gm, "graph", None)
            self.hooktrace_module_paths = tuple(
                _module_path(n) for n in getattr(graph, "nodes", ()))

    FxGraphHashDetails.__init__ = __init__  # type: ignore[method-assign]


_no_cache: list[bool] = []  # the module paths cannot enter the cache keys


def _origins_of(scheduler_node: Any) -> Iterable[Any]:
    for sn in scheduler_node.get_nodes():
        node = getattr(sn, "node", None)
        if node is not None:
            yield from getattr(node, "origins", ()) or ()


def _begin(wrapper: Any, kernel_name: str, nodes: list[Any], primary: Any) -> str | None:
    """Registers the site, in the generated module's header too (so that a cached copy
    registers it in the process loading it), and writes its begin mark; None when the
    wrapper cannot be marked (C++ wrapper)."""
    from torch._inductor.virtualized import V

    graph = V.graph
    if getattr(graph, "cpp_wrapper", False) or not hasattr(wrapper, "writeline"):
        return None
    root = wrapper
    while getattr(root, "parent_wrapper", None) is not None:
        root = root.parent_wrapper
    imports = getattr(root, "imports", None)
    if imports is None:
        return None
    phase = "backward" if getattr(graph, "is_backward", False) else "forward"
    if getattr(root, _MARKED, None) is None:
        imports.writeline("from hooktrace._C import kernel_begin as _ht_kb, "
                          "kernel_end as _ht_ke")
        imports.writeline("from hooktrace.record.kernels import site as _ht_site")
        setattr(root, _MARKED, 0)
        # the modules whose ops this graph holds, kernel or not: a module whose ops were
        # all fused into other modules' kernels has no kernel site, but ran (its summary
        # row says "fused", not nothing). Sites with no kernel name (MODULE_SITE).
        for path in _graph_modules(graph):
            site(MODULE_SITE, path, phase)
            imports.writeline(f"_ht_site({MODULE_SITE!r}, {path!r}, {phase!r})")
    if primary is not None and _module_path(primary) is not None:
        module = _module_path(primary) or ""
    else:
        module = _common_module(nodes)
    site(kernel_name, module, phase)  # known to this process now, as before
    n = getattr(root, _MARKED)
    setattr(root, _MARKED, n + 1)
    name = f"_ht_{n}"
    imports.writeline(f"{name} = _ht_site({kernel_name!r}, {module!r}, {phase!r})")
    wrapper.writeline(f"_ht_kb({name})")
    return name


def _graph_modules(graph: Any) -> list[str]:
    """Every module path (with its ancestors, the region's root left out) that a node of
    the graph being lowered belongs to, in first-seen order."""
    gm = getattr(graph, "orig_gm", None) or getattr(graph, "module", None)
    out: dict[str, None] = {}
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        path = _module_path(node)
        if not path:
            continue
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            out.setdefault(".".join(parts[:i]))
    return list(out)


def _end(wrapper: Any, name: str | None) -> None:
    if name is not None:
        wrapper.writeline(f"_ht_ke({name})")


def _module_path(node: Any) -> str | None:
    """The innermost module of an FX node, relative to the compiled region's root
    ("" for the root itself); None for a node without a module stack."""
    meta = getattr(node, "meta", None) or {}
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return "" if meta else None
    try:
        path = list(stack.values())[-1][0]
    except Exception:
        return None
    return normalize_path(str(path))


def normalize_path(source: str) -> str:
    """A Dynamo source path of a submodule as ``named_modules()`` names it, relative
    to the traced root: ``L['self'].blocks[0].mlp`` -> ``blocks.0.mlp``,
    ``L['self']._modules['blocks']._modules['0']`` -> ``blocks.0``.

    Example:
        >>> normalize_path("L['self'].layers[3]._modules['attn'].proj")
        'layers.3.attn.proj'
    """
    # drop the root: L['self'], G['model'], self
    m = re.match(r"""^(?:[LG]\[['"][^'"]+['"]\]|\w+)""", source)
    rest = source[m.end():] if m else source
    parts = (attr or index or key for attr, index, key in _PATH_PART.findall(rest))
    return ".".join(part for part in parts if part != "_modules")


def _common_module(nodes: list[Any]) -> str:
    """The nearest common ancestor of the compute nodes' innermost modules."""
    paths = []
    for node in nodes:
        target = getattr(node, "target", None)
        op = getattr(target, "__name__", str(target)).split(".")[0]
        if op in _VIEW_OPS:
            continue
        path = _module_path(node)
        if path is not None:
            paths.append(path)
    if not paths:  # only views: any node's module
        paths = [p for p in (_module_path(n) for n in nodes) if p is not None]
    # (commonprefix compares lists item by item: whole dotted parts)
    return ".".join(os.path.commonprefix([p.split(".") if p else [] for p in paths]))


# -- caches --------------------------------------------------------------------------

_saved_config: list[tuple[Any, str, Any]] = []


@functools.cache
def _mark_pass() -> Any:
    """:class:`torch._inductor.custom_graph_pass.CustomGraphPass` that changes nothing
    and whose uuid is this file's hash: it only gives marked code cache keys of its own
    (one instance per process)."""
    import hashlib
    from pathlib import Path

    from torch._inductor.custom_graph_pass import CustomGraphPass

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()

    class MarkPass(CustomGraphPass):  # type: ignore[misc]
        def __call__(self, graph: Any) -> None:
            return None

        def uuid(self) -> Any:
            return f"hooktrace-kernel-marks-{digest}"

    return MarkPass()


def _key_caches() -> None:
    """Marked code gets cache entries of its own: the mark pass joins
    ``post_grad_custom_post_pass`` (after the user's own passes, if any), whose uuids
    are in the FX graph cache's and AOTAutograd cache's keys. If that fails (a torch
    without custom passes), the caches are bypassed instead."""
    import torch._inductor.config as inductor_config

    if _no_cache:
        _bypass_caches()
        return
    try:
        mark = _mark_pass()
        current = inductor_config.post_grad_custom_post_pass
        if current is None:
            new: Any = mark
        elif _lists_of_passes():
            passes = tuple(current) if isinstance(current, (list, tuple)) else (current,)
            new = [*passes, mark]
        else:  # the user's own pass, and a torch that takes one pass only: left alone
            _bypass_caches()
            return
        _saved_config.append((inductor_config, "post_grad_custom_post_pass", current))
        inductor_config.post_grad_custom_post_pass = new
    except Exception:  # no custom passes here: marked code must not be cached
        _bypass_caches()


def _lists_of_passes() -> bool:
    """Whether this torch's Inductor takes a list in ``post_grad_custom_post_pass``
    (``custom_graph_pass.get_custom_graph_passes``, torch 2.12 or so); older ones call
    the setting itself, and a list there fails every compile ("'list' object is not
    callable", seen with torch 2.11 on an H200)."""
    try:
        from torch._inductor import custom_graph_pass
    except Exception:  # pragma: no cover - present wherever CustomGraphPass is
        return False
    return hasattr(custom_graph_pass, "get_custom_graph_passes")


def _bypass_caches() -> None:
    """Marked code must never come from or go to the compile caches."""
    import torch._inductor.config as inductor_config

    functorch_config: Any
    try:
        import torch._functorch.config as functorch_config
    except Exception:  # pragma: no cover - always present with Inductor
        functorch_config = None
    for cfg, key in ((inductor_config, "fx_graph_cache"),
                     (inductor_config, "fx_graph_remote_cache"),
                     (functorch_config, "enable_autograd_cache"),
                     (functorch_config, "enable_remote_autograd_cache")):
        if cfg is not None and hasattr(cfg, key):
            _saved_config.append((cfg, key, getattr(cfg, key)))
            setattr(cfg, key, False)


def _restore_config() -> None:
    while _saved_config:
        cfg, key, value = _saved_config.pop()
        setattr(cfg, key, value)
