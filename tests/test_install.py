#!/usr/bin/env python3
"""The installed tree is usable on its own: `meson install --destdir` into a
temporary folder, then `pkg-config --cflags --libs dtensor` there must
succeed with only fmt required (no backend's -dev package: the public headers
include none of theirs), no installed header may be an internal one, and a
small program that includes <dtensor/dtensor.h> must compile, link and run
against the installed tree alone (not the source tree), once with the flags
pkg-config gives and once as a CMake project that finds the installed CMake
package (find_package(dtensor), target dtensor::dtensor).

  test_install.py BUILD_DIR CXX [CXX args...]

Exits 77 (meson: skipped, and counted so) where pkg-config or cmake is
missing, saying which."""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

PROGRAM = r"""
#include <dtensor/dtensor.h>

#include <cstdio>

int main() {
  using namespace dtensor;
  double sum = 0;
  run_threads(2, [&](Communicator& world) {
    DeviceMesh mesh(world, {2});
    DTensor x = distribute_tensor(world.rank() == 0 ? Tensor::arange({4, 3}, DType::Float64) : Tensor(), mesh,
                                  Layout::parse("S(0)"));
    add_(x, x);
    Tensor full = x.full_tensor();
    if (world.rank() == 0) sum = full.get({3, 2});
  });
  std::printf("%g\n", sum);
  return sum == 22 ? 0 : 1;
}
"""

# Headers that must not be installed: every layer's detail/ folder (the
# library's own machinery, for the layers above and the tests), among them
# those that need what a user does not have (<cuda_runtime.h>).
INTERNAL = ["cuda_check.h", "caching_allocator.h", "compact_layout.h", "trace_recorder.h", "format.h"]

CMAKE_PROJECT = """
cmake_minimum_required(VERSION 3.20)
project(dtensor_consumer CXX)
find_package(dtensor 0.1 REQUIRED)
add_executable(main main.cpp)
target_link_libraries(main PRIVATE dtensor::dtensor)
"""


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        print(f"FAILED: {' '.join(map(str, cmd))}\n{p.stdout}{p.stderr}")
        sys.exit(1)
    return p.stdout


def main():
    build = pathlib.Path(sys.argv[1]).resolve()
    cxx = sys.argv[2:]
    pkg_config = shutil.which("pkg-config")
    if not pkg_config:
        print("skipped: pkg-config is not on PATH")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="dtensor-install-") as tmp:
        dest = pathlib.Path(tmp) / "root"
        run(["meson", "install", "-C", str(build), "--no-rebuild", "--destdir", str(dest)])
        pcs = list(dest.rglob("dtensor.pc"))
        if len(pcs) != 1:
            print(f"FAILED: expected one dtensor.pc under {dest}, found {pcs}")
            sys.exit(1)
        pc = pcs[0]
        # prefix=/usr/local in the file; the tree is under dest.
        prefix = None
        for line in pc.read_text().splitlines():
            if line.startswith("prefix="):
                prefix = line.split("=", 1)[1]
        root = str(dest) + prefix
        env = dict(os.environ, PKG_CONFIG_PATH=str(pc.parent))
        pkg = [pkg_config, f"--define-variable=prefix={root}", "dtensor"]
        private = run(pkg[:-1] + ["--print-requires-private", "dtensor"], env=env).split()
        if private:
            print(f"FAILED: dtensor.pc lists Requires.private {private}; no public header needs them\n{pc.read_text()}")
            sys.exit(1)
        flags = run(pkg[:-1] + ["--cflags", "--libs", "dtensor"], env=env).split()
        print("pkg-config --cflags --libs dtensor:", " ".join(flags))
        if f"-I{root}/include" not in flags and not any(f.startswith(f"-I{root}") for f in flags):
            print(f"FAILED: the flags do not point at the installed headers under {root}")
            sys.exit(1)
        headers = [h for h in (pathlib.Path(root) / "include").rglob("*.h")]
        leaked = [str(h) for h in headers if h.name in INTERNAL or "detail" in h.parts]
        if leaked or not headers:
            print(f"FAILED: internal headers installed: {leaked}" if leaked else "FAILED: no headers installed")
            sys.exit(1)
        for h in headers:
            if "cuda_runtime.h" in h.read_text():
                print(f"FAILED: {h} includes <cuda_runtime.h>")
                sys.exit(1)
        # Every installed header, in one translation unit: none may include
        # a header that was not installed (a detail/ one, a private one).
        every = pathlib.Path(tmp) / "every_header.cpp"
        include_root = pathlib.Path(root) / "include"
        every.write_text("".join(f'#include <{h.relative_to(include_root)}>\n' for h in sorted(headers)))
        run(cxx + ["-std=c++20", "-fsyntax-only", str(every)] + [f for f in flags if f.startswith("-I")], cwd=tmp)
        print(f"all {len(headers)} installed headers compile together against the installed tree alone")
        src = pathlib.Path(tmp) / "main.cpp"
        src.write_text(PROGRAM)
        exe = pathlib.Path(tmp) / "main"
        libdirs = [f[2:] for f in flags if f.startswith("-L")]
        # Run from the temporary folder, so that no relative path reaches the
        # source tree.
        run(cxx + ["-std=c++20", str(src), "-o", str(exe)] + flags, cwd=tmp)
        out = run([str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs)), cwd=tmp)
        print(f"the program built against the installed tree ran: {out.strip()}")
        build_with_cmake(tmp, root, cxx, libdirs)


def build_with_cmake(tmp, root, cxx, libdirs):
    """The same program as a CMake project that finds the installed package."""
    cmake = shutil.which("cmake")
    if not cmake:
        print("skipped: cmake is not on PATH (the pkg-config build above passed)")
        sys.exit(77)
    project = pathlib.Path(tmp) / "cmake_consumer"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    (project / "main.cpp").write_text(PROGRAM)
    build = project / "build"
    # cxx is meson's compiler command: a launcher (ccache) may come first.
    launchers = [a for a in cxx if os.path.basename(a) in ("ccache", "sccache")]
    compiler = [a for a in cxx if a not in launchers][0]
    flags = [a for a in cxx if a not in launchers and a != compiler]
    run([cmake, "-S", str(project), "-B", str(build), f"-DCMAKE_PREFIX_PATH={root}",
         f"-DCMAKE_CXX_COMPILER={compiler}", f"-DCMAKE_CXX_FLAGS={' '.join(flags)}"]
        + ([f"-DCMAKE_CXX_COMPILER_LAUNCHER={launchers[0]}"] if launchers else []), cwd=tmp)
    run([cmake, "--build", str(build)], cwd=tmp)
    out = run([str(build / "main")], env=dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs)), cwd=tmp)
    print(f"the CMake project built against the installed package ran: {out.strip()}")


if __name__ == "__main__":
    main()
