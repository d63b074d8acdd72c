"""Name numba's compiled kernels for ``perf``, down to the source line.

Usage, in the process to profile (before it imports a kernel, and after it has run them once)::

    import perf_map                      # tools/ on sys.path
    perf_map.install()                   # keep each cached kernel's object code as numba loads it
    ...                                  # import the packages, run a batch (the kernels load or compile)
    perf_map.write(objects="/tmp/objs")  # /tmp/perf-<pid>.map, and each kernel's object file

then ``perf record -p <pid>`` while it runs, and::

    perf report -i perf.data --sort symbol                  # time per compiled function
    python tools/perf_map.py lines perf.data /tmp/objs      # time per source line (NUMBA_DEBUGINFO=1 runs)

numba links everything a kernel calls into the kernel's own machine code and LLVM inlines most of it, so
``perf`` sees one anonymous block per kernel. The object code numba caches holds every function's symbol
(inlined ones excepted) and, compiled with ``NUMBA_DEBUGINFO=1`` (use a ``NUMBA_CACHE_DIR`` of its own: the
debug build is a different binary), a line table: ``lines`` maps each sample's address back through it with
``addr2line`` (binutils). A kernel numba loads from its cache hands its object code to LLVM and drops it;
:func:`install` keeps a reference as it goes by, so call it before the kernels are first used.
"""

from __future__ import annotations

import collections
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import toolargs

PACKAGES = ("graphstore", "sampling", "training")


def install() -> None:
    """Keep the object code of every kernel numba loads from its cache (read by :func:`write`)."""
    from numba.core import codegen

    if getattr(codegen.CodeLibrary, "_perf_map_kept", False):
        return
    original = codegen.CodeLibrary._set_compiled_object

    def keep(self: Any, value: bytes) -> Any:
        self._perf_map_object = value
        return original(self, value)

    codegen.CodeLibrary._set_compiled_object = keep
    codegen.CodeLibrary._perf_map_kept = True


def functions(elf: bytes) -> dict[str, tuple[int, int]]:
    """``{name: (offset in .text, size)}`` of the function symbols of a relocatable ELF64 object (numba's)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 object")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for sh_type, link, entsize, offset, size in ((s[1], s[6], s[9], s[4], s[5]) for s in sections):
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize or 24):
            name_at, info, _, shndx, value, length = struct.unpack_from("<IBBHQQ", elf, at)
            if info & 0xF == 2 and shndx:  # STT_FUNC, defined here
                end = elf.index(b"\0", strtab + name_at)
                out[elf[strtab + name_at:end].decode()] = (value, length)
    return out


def _kernels(packages: tuple[str, ...]) -> list[tuple[str, Any]]:
    from numba.core.registry import CPUDispatcher

    found = []
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] in packages:
            for name, obj in list(vars(module).items()):
                if isinstance(obj, CPUDispatcher) and obj.__module__ == module_name:
                    found.extend((f"{module_name}.{name}", cres) for cres in obj.overloads.values())
    return found


def write(objects: str | None = None, packages: tuple[str, ...] = PACKAGES) -> Path:
    """Write ``/tmp/perf-<pid>.map`` naming every function of the loaded kernels of ``packages``; with
    ``objects`` (a folder), also each kernel's object file and ``bases.json`` (where each was loaded) for
    ``lines``. Returns the map's path."""
    entries, bases = [], {}
    for i, (name, cres) in enumerate(_kernels(packages)):
        library = cres.library
        elf = getattr(library, "_perf_map_object", None) or getattr(library, "_compiled_object", None)
        entry = library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        if not elf or not entry:
            continue
        symbols = functions(elf)
        own = symbols.get(cres.fndesc.llvm_func_name)
        if own is None:
            continue
        base = entry - own[0]
        entries.extend((base + offset, size, symbol) for symbol, (offset, size) in symbols.items())
        if objects:
            Path(objects).mkdir(parents=True, exist_ok=True)
            path = Path(objects) / f"{i}-{name}.o"
            path.write_bytes(elf)
            bases[str(path)] = [base, max(offset + size for offset, size in symbols.values())]
    path = Path(f"/tmp/perf-{os.getpid()}.map")
    with open(path, "w") as fh:
        for address, size, symbol in sorted(set(entries)):
            fh.write(f"{address:x} {max(size, 1):x} {_readable(symbol)}\n")
    if objects:
        (Path(objects) / "bases.json").write_text(json.dumps(bases))
    return path


def _readable(symbol: str) -> str:
    """``sampling.kernels.picks._pick_blocked`` from numba's mangled name (the name itself when not one)."""
    match = re.match(r"(?:cfunc\.)?_ZN((?:\d+[A-Za-z_][A-Za-z0-9_]*)+)", symbol)
    if not match:
        return symbol
    parts, text = [], match.group(1)
    while text and text[0].isdigit():
        digits = re.match(r"\d+", text).group(0)
        n = int(digits)
        parts.append(text[len(digits):len(digits) + n])
        text = text[len(digits) + n:]
    return ".".join(parts)


def lines(perf_data: str, objects: str, top: int = 40) -> list[tuple[float, str]]:
    """Share of ``perf_data``'s samples per source line of the kernels in ``objects`` (:func:`write`'s)."""
    bases = json.loads((Path(objects) / "bases.json").read_text())
    script = subprocess.run(["perf", "script", "-i", perf_data, "-F", "ip"], capture_output=True, text=True,
                            check=True).stdout
    samples = collections.Counter(int(v, 16) for v in script.split())
    total = sum(samples.values())
    per_line: collections.Counter[str] = collections.Counter()
    for path, (base, length) in bases.items():
        hits = {ip - base: n for ip, n in samples.items() if 0 <= ip - base < length}
        if not hits:
            continue
        offsets = sorted(hits)
        found = subprocess.run(["addr2line", "-e", path, *map(hex, offsets)], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        for offset, where in zip(offsets, found):
            per_line[where.split(" ")[0]] += hits[offset]
    return [(n / total, where) for where, n in per_line.most_common(top)]


def main() -> int:
    parser = toolargs.parser(__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    per_line = sub.add_parser("lines", help="share of the samples per source line of the kernels")
    per_line.add_argument("perf_data")
    per_line.add_argument("objects", help="the folder write(objects=...) filled")
    per_line.add_argument("--top", type=toolargs.count, default=40)
    args = parser.parse_args()
    if not (Path(args.objects) / "bases.json").is_file():
        parser.error(f"{args.objects}: no bases.json; give the folder perf_map.write(objects=...) filled")
    for share, where in lines(args.perf_data, args.objects, args.top):
        print(f"{100 * share:5.1f}%  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(toolargs.run(main))
