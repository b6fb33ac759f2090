"""Build llama.cpp's C++ `llama-server` once per llama.cpp version, and cache it.

The integration tests put the real `llama-server --metrics` behind `slo proxy`. Debian 12 has
no llama.cpp package, and nothing may be fetched at run time but registry packages, so the
server is built from the llama.cpp sources the `thirdparty` extra already uses: the
llama-cpp-python sdist vendors llama.cpp (vendor/llama.cpp, tools/server included) and its
version pins llama.cpp's commit, so it names the cache:

    ~/.cache/llm-slo/llama-server-<llama-cpp-python version>/bin/llama-server

Only the server target is built (Release, static, no tests, examples, web UI, curl or
OpenSSL); a later run finds the cached binary and takes no time. Run it by hand too:

    python tests/helpers/build_llama_server.py [--version 0.3.36] [--jobs 2]

It prints the binary's path. Standard library only, so it runs before the project installs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PACKAGE = "llama-cpp-python"
CACHE_PREFIX = "llama-server-"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # -O1, not -O3: it compiles in ~60% of the CPU time (15.7 CPU minutes at -O3 on this
    # machine), and the tests' model is too small for the difference in speed to matter.
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    # One self-contained executable: the cache holds a single file, no shared libraries.
    "-DBUILD_SHARED_LIBS=OFF",
    # Portable code: a cache carried to another CPU of the same architecture still runs (the
    # tests' model is tiny; speed does not matter).
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",  # the server lives in tools/server
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # No web UI: building it needs npm, and the prebuilt one is a download at build time.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-slo"


def cached_binary(version: str) -> Path:
    """Where the server built from llama-cpp-python `version`'s sources is kept."""
    return cache_root() / f"{CACHE_PREFIX}{version}" / "bin" / "llama-server"


def cached_binaries() -> list[Path]:
    """Every cached server, the most recently built first."""
    found = cache_root().glob(f"{CACHE_PREFIX}*/bin/llama-server")
    return sorted(
        (path for path in found if os.access(path, os.X_OK)),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def download_sdist(version: str | None, into: Path) -> tuple[str, Path]:
    """The llama-cpp-python sdist (pinned to `version`, else the newest): (version, path)."""
    requirement = f"{PACKAGE}=={version}" if version else PACKAGE
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--no-binary", ":all:", "--dest", str(into), requirement]  # fmt: skip
    subprocess.run(command, check=True)
    archives = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if len(archives) != 1:
        raise RuntimeError(f"pip download {requirement} left {archives} in {into}, not one sdist")
    found_version = archives[0].name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")
    return found_version, archives[0]


def unpack_llama_cpp(sdist: Path, into: Path) -> Path:
    """Extract the sdist; return its vendored llama.cpp source tree."""
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")
    (top,) = [path for path in into.iterdir() if path.is_dir()]
    source = top / "vendor" / "llama.cpp"
    if not (source / "tools" / "server" / "CMakeLists.txt").is_file():
        raise RuntimeError(f"{sdist.name}: vendor/llama.cpp has no tools/server to build")
    return source


def build(source: Path, build_dir: Path, jobs: int, log_path: Path) -> Path:
    """Configure and build the `llama-server` target only; return the binary. The compiler's
    output goes to `log_path` (its last lines are printed if the build fails)."""
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS]
    compile_ = ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        for command in (configure, compile_):
            if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                log.flush()
                tail = "".join(log_path.read_text().splitlines(keepends=True)[-40:])
                raise RuntimeError(f"{' '.join(command[:2])} failed; see {log_path}:\n{tail}")
    binary = build_dir / "bin" / "llama-server"
    if not binary.is_file():
        raise RuntimeError(f"the build finished but {binary} is missing")
    return binary


def ensure(version: str | None, jobs: int) -> Path:
    """The cached server for `version` (built first if missing); returns its path. Without a
    version: the newest cached one, else one built from the newest sdist."""
    if version and (binary := cached_binary(version)).is_file():
        return binary
    if version is None and (cached := cached_binaries()):
        return cached[0]
    with tempfile.TemporaryDirectory(prefix="llama-server-build-") as scratch_name:
        scratch = Path(scratch_name)
        (scratch / "sdist").mkdir()
        version, sdist = download_sdist(version, scratch / "sdist")
        binary = cached_binary(version)
        if binary.is_file():
            return binary
        started = time.monotonic()
        log_path = binary.parent.parent / "build.log"
        print(f"building llama-server from {PACKAGE} {version} (log: {log_path})", file=sys.stderr)
        (scratch / "src").mkdir()
        source = unpack_llama_cpp(sdist, scratch / "src")
        built = build(source, scratch / "build", jobs, log_path)
        binary.parent.mkdir(parents=True, exist_ok=True)
        # Copy then rename: a run stopped halfway never leaves a truncated binary in the cache.
        partial = binary.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.replace(binary)
        minutes, seconds = divmod(round(time.monotonic() - started), 60)
        print(f"built llama-server from {PACKAGE} {version} in {minutes} min {seconds} s",
              file=sys.stderr)  # fmt: skip
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--version",
        default=installed_version(),
        help=f"{PACKAGE} version whose llama.cpp to build (default: the installed one, else "
        "the newest cached server, else the newest release)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed; on Debian: apt-get install cmake g++")
    print(ensure(args.version, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
