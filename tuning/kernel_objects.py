"""Compiled micro-kernels kept on disk, so each is compiled once: the object file the runner
measures (linked alone into a shared library) is the one the bundle links, renamed.

Compiling is most of a quick tuning's cost; compiling every kernel of a bundle's trees
again took 21 of the 49 s of one test's tuning of a batch matmul with four
dynamic dims (2-vCPU Xeon). The same machine code is measured and shipped.

A tuning database with a file keeps its compiled kernels beside it (Database.kernel_objects),
so a fresh database is a tuning from scratch, and a resumed one links what it measured;
otherwise they live in a directory of the process, removed at its exit.

An entry is keyed by the workload, the kernel, the target, a fingerprint of the code
that lowers it (tuning/'s sources and TVM's version) and the TIR passes left out
(TF_DIETCODE_DISABLE_PASSES, as measure.compile_kernel builds), so no object outlives the
compiler that made it, and a tuning with a pass left out never links one built with it.
Entries are written under a temporary name and renamed into place, so processes sharing
a directory (xdist workers, tuning runs side by side) never read half a file; one that
cannot be loaded is compiled again.
"""

import atexit
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import tvm
from tvm.support import cc

from tf_dietcode.tuning import measure
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.tir_passes import pipeline
from tf_dietcode.tuning.workload import Workload

EXPORTED_PREFIX = "__tvm_ffi_"  # the C symbol TVM's library modules export a function `name` under


@functools.lru_cache(maxsize=1)
def process_directory() -> pathlib.Path:
    """This process's directory of kept kernels, for tunings whose database has no file."""
    directory = tempfile.mkdtemp(prefix="tf_dietcode-kernels-")
    atexit.register(shutil.rmtree, directory, True)
    return pathlib.Path(directory)


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """TVM's version and every source file of tuning/ (templates and passes included)."""
    digest = hashlib.sha256(tvm.__version__.encode())
    root = pathlib.Path(__file__).parent
    for source in sorted(root.rglob("*.py")):
        digest.update(str(source.relative_to(root)).encode() + source.read_bytes())
    return digest.hexdigest()


def _write_atomically(path: pathlib.Path, write) -> None:
    """write(temporary path), then the file renamed to `path`."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _linked(object_file: pathlib.Path, library: pathlib.Path) -> pathlib.Path:
    cc.create_shared(str(library), [str(object_file)])
    return library


@dataclasses.dataclass(frozen=True)
class KernelObjects:
    directory: pathlib.Path = dataclasses.field(default_factory=process_directory)

    def _entry(self, workload: Workload, kernel, hw: Hardware) -> pathlib.Path:
        key = json.dumps([workload.key(), dataclasses.asdict(kernel), dataclasses.asdict(hw), _code_fingerprint(),
                          pipeline.disabled_passes()])
        return self.directory / hashlib.sha256(key.encode()).hexdigest()[:32]

    def object_file(self, workload: Workload, kernel, hw: Hardware) -> pathlib.Path:
        """The kernel's object file (its function "main", symbolic in the dynamic dims), compiled
        now if it is not kept yet."""
        path = self._entry(workload, kernel, hw).with_suffix(".o")
        if not path.exists():
            executable = measure.compile_kernel(workload, kernel, hw)
            if executable.mod.imports:
                raise RuntimeError("a CPU build came with imported modules, which an object file does not hold")
            self.directory.mkdir(parents=True, exist_ok=True)
            _write_atomically(path, executable.mod.write_to_file)
        return path

    def _using(self, workload: Workload, kernel, hw: Hardware, use):
        """use(the kernel's object file); an entry it cannot read (cut short, say) is compiled again, once.
        A kernel that fails to compile raises at once."""
        path = self.object_file(workload, kernel, hw)
        try:
            return use(path)
        except Exception:  # noqa: BLE001 - a damaged entry: compile it again, once
            path.unlink(missing_ok=True)
            return use(self.object_file(workload, kernel, hw))

    def library(self, workload: Workload, kernel, hw: Hardware, directory: pathlib.Path) -> pathlib.Path:
        """The kernel linked alone into a shared library in `directory` (as export_library links)."""
        destination = self._library_path(workload, kernel, hw, directory)
        return self._using(workload, kernel, hw, lambda path: _linked(path, destination))

    def load(self, workload: Workload, kernel, hw: Hardware):
        """The kernel as a loaded module (its function "main"). The library it is linked into is
        removed once loaded: only object files are kept (about 200 KB a kernel)."""
        with tempfile.TemporaryDirectory(prefix="tf_dietcode-kernel-") as scratch:
            destination = self._library_path(workload, kernel, hw, pathlib.Path(scratch))
            return self._using(workload, kernel, hw,
                               lambda path: tvm.runtime.load_module(str(_linked(path, destination))))

    def _library_path(self, workload: Workload, kernel, hw: Hardware, directory: pathlib.Path) -> pathlib.Path:
        """Named by the entry: the dynamic loader keeps a library by its path, so a path never names two kernels."""
        return directory / self._entry(workload, kernel, hw).with_suffix(".so").name

    def renamed_object(self, workload: Workload, kernel, hw: Hardware, symbol: str,
                       destination: pathlib.Path) -> pathlib.Path:
        """A copy of the kernel's object file at `destination`, its function exported as `symbol`."""
        def renamed(path: pathlib.Path) -> pathlib.Path:
            subprocess.run([os.environ.get("OBJCOPY", "objcopy"),
                            f"--redefine-sym={EXPORTED_PREFIX}main={EXPORTED_PREFIX}{symbol}",
                            str(path), str(destination)], check=True, capture_output=True)
            return destination

        return self._using(workload, kernel, hw, renamed)
