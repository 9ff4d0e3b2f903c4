"""A content-addressed store of kernel bundles for Keras layers.

A tuned DietDense layer names its bundle by path, and that path must outlive
the places a bundle comes from: tune()'s scratch directory, and the
temporary directory Keras extracts a `.keras` file's assets into. The store
keeps each bundle once, as `<digest>.json` and `<digest>.so` in one flat
directory (`bundles/` in the user's cache, user_cache):
names unique per bundle, so a SavedModel's assets/ can hold the bundles of
several layers side by side. optimize() names the bundle in its output's
assets/ the same way: the op library keeps each bundle it loads for the life of
the process, by path (and the dynamic loader each library by file name), so a
path must never name a second bundle.
"""

import hashlib
import json
import os
import pathlib
import secrets

from tf_dietcode import user_cache


def root() -> pathlib.Path:
    return user_cache.directory() / "bundles"


def files(manifest_path: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path]:
    """A bundle's manifest and the library it names (beside it)."""
    manifest_path = pathlib.Path(manifest_path)
    library = json.loads(manifest_path.read_text())["library"]
    return manifest_path, manifest_path.parent / library


def install(manifest_path: str | os.PathLike, store: pathlib.Path | None = None) -> pathlib.Path:
    """The bundle whose manifest is at `manifest_path` (or in that directory),
    copied into `store` (default: root()) unless it is there; returns the stored manifest's path."""
    manifest_path = pathlib.Path(manifest_path)
    if manifest_path.is_dir():  # as tune() writes it (TVM is loaded then anyway)
        from tf_dietcode.tuning.bundle import MANIFEST

        manifest_path = manifest_path / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    # The library's own name is left out: a stored bundle installed again is the same bundle.
    identity = {key: value for key, value in manifest.items() if key != "library"}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    store = root() if store is None else store
    stored = store / f"{digest}.json"
    if stored.exists():
        return stored
    store.mkdir(parents=True, exist_ok=True)
    # The library first, the manifest last: a manifest in the store always has its library.
    _atomic_write(store / f"{digest}.so", (manifest_path.parent / manifest["library"]).read_bytes())
    _atomic_write(stored, json.dumps({**manifest, "library": f"{digest}.so"}, indent=1).encode())
    return stored


def _atomic_write(target: pathlib.Path, data: bytes) -> None:
    """Readers see the whole file or none (concurrent installs of one bundle are harmless). Its
    mode follows the umask, as any file's: a SavedModel's assets/ gets a copy of it."""
    staging = target.with_name(f".staging-{secrets.token_hex(6)}-{target.name}")
    try:
        staging.write_bytes(data)
        os.replace(staging, target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
