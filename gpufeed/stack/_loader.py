"""What the dynamic linker does when gpufeed's GPU libraries load, replayed over a set of files.

A set of files is either an installed environment (site-packages) or the files of the wheels pip
would install (read remotely). Each GPU component is replayed in the order its code loads things:

* **onnxruntime's CUDA provider**: ``onnxruntime.preload_dlls()`` (which the server calls first)
  loads the CUDA and cuDNN libraries by their full path in the ``nvidia`` packages (the list is
  onnxruntime's own ``_get_nvidia_dll_paths``, read from the installed ``onnxruntime/__init__.py``);
  then the provider library is loaded by its full path. The provider has no RUNPATH, so each of
  its ``DT_NEEDED`` entries must match a library already loaded (by SONAME) or a system one.
* **DALI**: its Python extension and ``DT_NEEDED`` closure, through DALI's RUNPATH; then what DALI
  opens by name at run time (``dlopen``; the names come from DALI's source, see :data:`DLOPENS`).
* **nvImageCodec** (DALI's image decoders): ``libnvimgcodec.so.0`` loads every extension in its
  ``extensions`` folder by path; each extension opens its codec library by name (nvJPEG, ...).

A name is found as the dynamic linker finds it: an object already loaded with that SONAME; the
RUNPATH (else RPATH) of the object asking, with ``$ORIGIN`` as that object's folder; else the
system, which here means only the libraries listed in :data:`DRIVER_LIBRARIES` and
:data:`SYSTEM_LIBRARIES`, each with why it may be taken for granted. Every undefined symbol bound
by its version to one of the set's libraries must be defined there (a provider built against a
newer cuBLAS than the one installed fails here, not at the first inference).
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufeed.stack._elf import ElfInfo

__all__ = [
    "DLOPENS",
    "DRIVER_LIBRARIES",
    "SYSTEM_LIBRARIES",
    "Dlopen",
    "Found",
    "LoadReplay",
    "onnxruntime_preload_paths",
]

# Libraries the NVIDIA driver installs (the container toolkit mounts them into a container).
DRIVER_LIBRARIES = {
    "libcuda.so.1": "the CUDA driver API (NVIDIA driver)",
    "libnvidia-ml.so.1": "NVML (NVIDIA driver)",
    "libnvcuvid.so.1": "NVDEC's video decode library (NVIDIA driver; a container needs the 'video' capability)",
}
# What every Linux system gpufeed supports has: glibc and the GCC runtime (the manylinux_2_28 policy
# of PEP 600 lets wheels rely on them), and zlib, which cuDNN 9 needs (DT_NEEDED of its sub-libraries)
# although manylinux does not list it: zlib1g is a required package on Debian and Ubuntu, and zlib
# is in every RHEL-family base image.
SYSTEM_LIBRARIES = {
    **dict.fromkeys(
        ("libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "ld-linux-x86-64.so.2"),
        "glibc (manylinux_2_28 policy)",
    ),
    **dict.fromkeys(("libstdc++.so.6", "libgcc_s.so.1"), "the GCC runtime (manylinux_2_28 policy)"),
    "libz.so.1": "zlib: part of every Debian/Ubuntu (zlib1g is required) and RHEL-family system",
}


@dataclass(frozen=True)
class Dlopen:
    """Libraries a component opens by name at run time (``dlopen``), from its source.

    Attributes:
        loader: Regular expression matching the path (under site-packages) of the file that opens them.
        names: The names it asks for; ``{cuda}`` is the stack's CUDA major.
        required: Whether gpufeed needs them (else a missing one disables a feature gpufeed does not use).
        own_folder: Looked up in the loader's own folder (by path), not through the linker's search.
        why: What needs them, and where that is written.
    """

    loader: str
    names: tuple[str, ...]
    required: bool
    why: str
    own_folder: bool = False


DLOPENS: tuple[Dlopen, ...] = (
    Dlopen(
        r"nvidia/dali/libdali_core\.so$",
        ("libcuda.so.1",),
        True,
        "DALI's CUDA driver calls (dali/core/dynlink_cuda.cc)",
    ),
    Dlopen(
        r"nvidia/dali/libdali_core\.so$", ("libnvidia-ml.so.1",), False, "DALI's NVML queries (dali/util/nvml_wrap.cc)"
    ),
    Dlopen(
        r"nvidia/dali/libdali_operators\.so$", ("libnvimgcodec.so.0",), True, "DALI's image decoders (nvImageCodec)"
    ),
    Dlopen(
        r"nvidia/dali/libdali_operators\.so$",
        ("libnvcuvid.so.1",),
        True,
        "DALI's NVDEC video decoding (dynlink_nvcuvid)",
    ),
    Dlopen(
        r"nvidia/dali/libdali_operators\.so$",
        ("libnvcomp.so.5",),
        False,
        "DALI's nvCOMP decompression (dali/core/dynlink_nvcomp.cc; not used by gpufeed)",
    ),
    Dlopen(
        r"nvidia/dali/libdali_operators\.so$",
        ("libcufile.so.0",),
        False,
        "DALI's GPUDirect Storage reads (dynlink_cufile.cc; not used by gpufeed)",
    ),
    Dlopen(
        r"nvidia/dali/libdali_operators\.so$",
        ("libnppc.so.{cuda}", "libnppicc.so.{cuda}", "libnppig.so.{cuda}"),
        False,
        "NPP, for DALI's remap, debayer and equalize operators (dali/npp/npp_wrap.cc; not used by gpufeed)",
    ),
    Dlopen(
        r"nvidia/dali/libdali_kernels\.so$",
        ("libcufft.so.{cufft}",),
        False,
        "cuFFT, for DALI's FFT and spectrogram operators (not used by gpufeed)",
    ),
    Dlopen(
        r"nvidia/nvimgcodec/extensions/libnvjpeg_ext\.so",
        ("libnvjpeg.so.{cuda}",),
        True,
        "nvJPEG, the GPU JPEG decoder (nvImageCodec src/dynlink/dynlink_nvjpeg.cpp)",
    ),
    Dlopen(
        r"nvidia/nvimgcodec/extensions/libnvjpeg2k_ext\.so", ("libnvjpeg2k.so.0",), False, "nvJPEG2000 (JPEG 2000 only)"
    ),
    Dlopen(r"nvidia/nvimgcodec/extensions/libnvtiff_ext\.so", ("libnvtiff.so.0",), False, "nvTIFF (TIFF only)"),
    Dlopen(
        r"/libnvjpeg\.so\.\d+$",
        ("libnvcuvid.so.1",),
        False,
        "the hardware JPEG decoder (A100, H100) goes through NVDEC's library",
    ),
    Dlopen(r"/libcudart\.so\.\d+$", ("libcuda.so.1",), True, "the CUDA runtime loads the driver"),
    Dlopen(
        r"onnxruntime/capi/libonnxruntime_providers_cuda\.so$",
        ("libcudnn.so.9",),
        True,
        "cuDNN, for Conv (onnxruntime 1.3x loads it lazily, microsoft/onnxruntime#29252)",
    ),
    Dlopen(
        r"onnxruntime/capi/libonnxruntime_providers_cuda\.so$",
        ("libnvrtc.so.{cuda}",),
        False,
        "NVRTC (strings of the provider)",
    ),
    Dlopen(
        r"/libcublasLt\.so\.\d+$",
        ("libnvrtc.so.{cuda}",),
        False,
        "NVRTC, for cuBLASLt's runtime-compiled kernels (its strings)",
    ),
    Dlopen(
        r"/libcudnn\.so\.9$",
        ("libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_adv.so.9"),
        True,
        "cuDNN 9's shim opens its sub-libraries from its own folder (names in its strings)",
        own_folder=True,
    ),
    Dlopen(
        r"/libcudnn_graph\.so\.9$",
        ("libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9"),
        True,
        "cuDNN's engines (names in libcudnn_graph's strings)",
    ),
    Dlopen(
        r"/libcudnn_graph\.so\.9$",
        ("libcudnn_engines_tensor_ir.so.9",),
        False,
        "cuDNN's tensor-IR engines (9.1x and later)",
    ),
    Dlopen(
        r"/libcudnn\.so\.9$",
        ("libcudnn_ext.so.9",),
        False,
        "cuDNN's extension library (9.1x and later)",
        own_folder=True,
    ),
    Dlopen(r"/libcudnn_graph\.so\.9$", ("libnvrtc.so.{cuda}",), False, "NVRTC, for cuDNN's runtime-compiled engines"),
)


@dataclass(frozen=True)
class Found:
    """How one library name asked for by one file was (or was not) found.

    Attributes:
        component: ``onnxruntime``, ``DALI`` or ``nvImageCodec``.
        name: The name asked for (a SONAME, or a path for a library loaded by path).
        asked_by: The file asking (site-packages relative), or the component's own code.
        how: ``package``, ``loaded`` (already loaded, matched by SONAME), ``driver``, ``system`` or ``missing``.
        where: The file found (site-packages relative), or why the driver/system has it.
        package: The distribution holding it (``""`` for driver and system libraries).
        required: Whether gpufeed needs it.
        note: Extra words: why it is loaded, or where a missing library does lie in the set.
    """

    component: str
    name: str
    asked_by: str
    how: str
    where: str = ""
    package: str = ""
    required: bool = True
    note: str = ""


@dataclass
class LoadReplay:
    """One process's loads, replayed over a set of files.

    Args:
        files: Path (site-packages relative, ``/``-separated) -> distribution name, for every file of the set.
        elf: Reads a file's :class:`ElfInfo` (may download it).
        cuda_major: The stack's CUDA major, for the ``{cuda}`` names of :data:`DLOPENS`.
    """

    files: dict[str, str]
    elf: Callable[[str], ElfInfo]
    cuda_major: int
    found: list[Found] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _loaded: dict[str, str] = field(default_factory=dict)  # SONAME (or file name) -> path
    _by_name: dict[str, list[str]] = field(default_factory=dict)
    _pending: list[tuple[str, str, Dlopen]] = field(default_factory=list)

    def __post_init__(self) -> None:
        read, facts = self.elf, {}

        def cached(path: str) -> ElfInfo:  # each file's facts are read once, however often they are asked
            if path not in facts:
                facts[path] = read(path)
            return facts[path]

        self.elf = cached
        for path in self.files:
            self._by_name.setdefault(posixpath.basename(path), []).append(path)

    def _names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        cufft = 12 if self.cuda_major >= 13 else 11  # cuFFT's major: 11 in CUDA 12, 12 in CUDA 13
        return tuple(n.format(cuda=self.cuda_major, cufft=cufft) for n in names)

    def load_path(self, component: str, path: str, asked_by: str, *, required: bool = True, note: str = "") -> bool:
        """Load a file by its path, then everything it needs; whether it was there."""
        if path not in self.files:
            self.found.append(Found(component, path, asked_by, "missing", required=required, note=note))
            if required:
                self.problems.append(f"{component}: {path} (loaded by path by {asked_by}) is in no package of the set")
            return False
        self.found.append(Found(component, path, asked_by, "package", path, self.files[path], required, note))
        self._load(component, path)
        return True

    def _load(self, component: str, path: str) -> None:
        info = self.elf(path)
        name = info.soname or posixpath.basename(path)
        if self._loaded.get(name) == path:
            return
        self._loaded.setdefault(name, path)
        for needed in info.needed:
            self.load_name(component, needed, path, required=True, kind="DT_NEEDED")
        self._check_symbols(component, path, info)
        for rule in DLOPENS:
            if re.search(rule.loader, path):
                self._pending.append((component, path, rule))

    def run_dlopens(self) -> None:
        """Open what the loaded libraries open by name at first use (after the component's own loads).

        ``dlopen`` happens when a feature is first used, by which time everything the component
        loads up front (``preload_dlls()``, the provider) is loaded: a library opened by name then
        matches one already loaded by SONAME, as it does in the process.
        """
        while self._pending:
            component, path, rule = self._pending.pop(0)
            for wanted in self._names(rule.names):
                self.load_name(component, wanted, path, required=rule.required, note=rule.why, own=rule.own_folder)

    def load_name(
        self,
        component: str,
        name: str,
        asked_by: str,
        *,
        required: bool,
        note: str = "",
        own: bool = False,
        kind: str = "dlopen",
    ) -> str | None:
        """Find ``name`` as the linker would for ``asked_by`` and load it; the path found, if any."""
        if name in self._loaded and not own:
            self._record(
                Found(
                    component,
                    name,
                    asked_by,
                    "loaded",
                    self._loaded[name],
                    self.files.get(self._loaded[name], ""),
                    required,
                    note,
                )
            )
            return self._loaded[name]
        folder = posixpath.dirname(asked_by)
        if own:
            search: tuple[str, ...] = (folder,)
        else:
            search = (
                tuple(_expand(p, folder) for p in self.elf(asked_by).search_path()) if asked_by in self.files else ()
            )
        for directory in search:
            candidate = posixpath.normpath(posixpath.join(directory, name))
            if candidate in self.files:
                self._record(
                    Found(component, name, asked_by, "package", candidate, self.files[candidate], required, note)
                )
                self._load(component, candidate)
                return candidate
        for table, how in ((DRIVER_LIBRARIES, "driver"), (SYSTEM_LIBRARIES, "system")):
            if name in table:
                self._record(Found(component, name, asked_by, how, table[name], "", required, note))
                return None
        elsewhere = self._by_name.get(name, [])
        where = (
            f"present at {', '.join(elsewhere)} but not on {asked_by}'s search path" if elsewhere else "in no package"
        )
        self._record(Found(component, name, asked_by, "missing", "", "", required, f"{note}; {where}".strip("; ")))
        if required:
            self.problems.append(f"{component}: {name} ({kind} of {asked_by}) is {where}")
        return None

    def _record(self, found: Found) -> None:
        if found not in self.found:
            self.found.append(found)

    def _check_symbols(self, component: str, path: str, info: ElfInfo) -> None:
        """Each undefined symbol versioned to a library of the set must be defined there."""
        missing: dict[str, list[str]] = {}
        for symbol in info.undefined:
            if symbol.weak or not symbol.library or symbol.library not in self._loaded:
                continue
            provider_path = self._loaded[symbol.library]
            provider = self.elf(provider_path)
            if (symbol.name, symbol.version) not in provider.defined_versions and symbol.name not in provider.defined:
                missing.setdefault(provider_path, []).append(f"{symbol.name}@{symbol.version}")
        for provider_path, names in missing.items():
            shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            self.problems.append(
                f"{component}: {path} needs {len(names)} symbol(s) that {provider_path} "
                f"({self.files.get(provider_path, '?')}) does not define: {shown}"
            )


def _expand(entry: str, folder: str) -> str:
    """A RUNPATH entry with ``$ORIGIN`` replaced by the asking file's folder (site-packages relative)."""
    return entry.replace("${ORIGIN}", folder).replace("$ORIGIN", folder)


def onnxruntime_preload_paths(init_source: str, cuda_version: str) -> list[str]:
    """The files ``onnxruntime.preload_dlls()`` loads on Linux, by running onnxruntime's own list.

    The three small functions that build the list (``_get_nvidia_dll_paths`` and the two helpers it
    calls) are taken from the installed ``onnxruntime/__init__.py`` and evaluated with the package's
    ``cuda_version``, so the list is whatever that release of onnxruntime does.

    Raises:
        ValueError: The source lacks those functions (a release that builds the list another way).
    """
    wanted = {"_get_nvidia_dll_paths", "_extract_cuda_major_version", "_get_cufft_version"}
    tree = ast.parse(init_source)
    functions: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    found = {n.name for n in functions if isinstance(n, ast.FunctionDef)}
    if found != wanted:
        raise ValueError(f"onnxruntime/__init__.py lacks {sorted(wanted - found)}")
    namespace: dict = {"cuda_version": cuda_version}
    exec(compile(ast.Module(body=functions, type_ignores=[]), "onnxruntime/__init__.py", "exec"), namespace)
    return ["/".join(parts) for parts in namespace["_get_nvidia_dll_paths"](False, True, True)]
