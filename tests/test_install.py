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

Prints one `case:` line per check (tests/script_cases.py). Where pkg-config
or cmake is missing, the checks that need it are skips saying which, and the
others still run; a check that an earlier failure leaves without its input
fails, naming that failure. Exits 1 if any failed."""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases  # noqa: E402

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


# The checks, in order.
INSTALLED = "meson install --destdir installs the build into a temporary folder"
ONE_PC = "the installed tree holds one dtensor.pc"
NO_PRIVATE = "dtensor.pc requires nothing privately (no public header needs a backend's package)"
FLAGS = "pkg-config --cflags --libs dtensor points at the installed headers"
HEADERS = "headers are installed, none of them internal (detail/ or a private header)"
NO_CUDA = "no installed header includes <cuda_runtime.h>"
TOGETHER = "every installed header compiles together against the installed tree alone"
PKG_PROGRAM = "a program built with pkg-config's flags runs against the installed tree alone"
CMAKE_PROGRAM = "a CMake project finds the installed package (find_package(dtensor)), builds and runs"


class Failed(Exception):
    """A command that exited non-zero: its command line and output."""


def run(cmd, **kw):
    """CMD's stdout; Failed if it exits non-zero."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise Failed(f"{' '.join(map(str, cmd))} exited with {p.returncode}\n{p.stdout}{p.stderr}")
    return p.stdout


def not_reached(cases, names, because):
    for name in names:
        cases.fail(name, f"not run: {because}")


def main():
    build = pathlib.Path(sys.argv[1]).resolve()
    cxx = sys.argv[2:]
    cases = Cases()
    pkg_config = shutil.which("pkg-config")
    with tempfile.TemporaryDirectory(prefix="dtensor-install-") as tmp:
        dest = pathlib.Path(tmp) / "root"
        try:
            run(["meson", "install", "-C", str(build), "--no-rebuild", "--destdir", str(dest)])
            cases.check(INSTALLED, True)
        except Failed as e:
            cases.fail(INSTALLED, e)
        pcs = list(dest.rglob("dtensor.pc"))
        if not cases.check(ONE_PC, len(pcs) == 1, f"expected one dtensor.pc under {dest}, found {pcs}"):
            not_reached(cases, [NO_PRIVATE, FLAGS, HEADERS, NO_CUDA, TOGETHER, PKG_PROGRAM, CMAKE_PROGRAM],
                        f"no single dtensor.pc under {dest}")
            return cases.finish()
        pc = pcs[0]
        # prefix=/usr/local in the file; the tree is under dest.
        prefix = None
        for line in pc.read_text().splitlines():
            if line.startswith("prefix="):
                prefix = line.split("=", 1)[1]
        root = str(dest) + prefix
        include_root = pathlib.Path(root) / "include"
        headers = sorted(include_root.rglob("*.h"))
        leaked = [str(h) for h in headers if h.name in INTERNAL or "detail" in h.parts]
        cases.check(HEADERS, bool(headers) and not leaked,
                    f"internal headers installed: {leaked}" if leaked else "no headers installed")
        cuda = [str(h) for h in headers if "cuda_runtime.h" in h.read_text()]
        cases.check(NO_CUDA, not cuda, f"{cuda} include <cuda_runtime.h>")
        if pkg_config:
            libdirs = build_with_pkg_config(cases, tmp, pc, pkg_config, root, headers, include_root, cxx)
        else:
            for name in [NO_PRIVATE, FLAGS, TOGETHER, PKG_PROGRAM]:
                cases.skip(name, "pkg-config is not on PATH")
            libdirs = None
        # Without pkg-config's -L folders: those of the installed library.
        if libdirs is None:
            libdirs = sorted({str(lib.parent) for lib in dest.rglob("libdtensor*.so*")})
        build_with_cmake(cases, tmp, root, cxx, libdirs)
    return cases.finish()


def build_with_pkg_config(cases, tmp, pc, pkg_config, root, headers, include_root, cxx):
    """The checks through pkg-config; the -L folders of its flags, or None."""
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc.parent))
    pkg = [pkg_config, f"--define-variable=prefix={root}"]
    try:
        private = run(pkg + ["--print-requires-private", "dtensor"], env=env).split()
        cases.check(NO_PRIVATE, not private,
                    f"dtensor.pc lists Requires.private {private}; no public header needs them\n{pc.read_text()}")
    except Failed as e:
        cases.fail(NO_PRIVATE, e)
    try:
        flags = run(pkg + ["--cflags", "--libs", "dtensor"], env=env).split()
    except Failed as e:
        cases.fail(FLAGS, e)
        not_reached(cases, [TOGETHER, PKG_PROGRAM], "pkg-config --cflags --libs dtensor failed")
        return None
    print("pkg-config --cflags --libs dtensor:", " ".join(flags))
    cases.check(FLAGS, f"-I{root}/include" in flags or any(f.startswith(f"-I{root}") for f in flags),
                f"the flags {flags} do not point at the installed headers under {root}")
    # Every installed header, in one translation unit: none may include
    # a header that was not installed (a detail/ one, a private one).
    every = pathlib.Path(tmp) / "every_header.cpp"
    every.write_text("".join(f"#include <{h.relative_to(include_root)}>\n" for h in headers))
    try:
        run(cxx + ["-std=c++20", "-fsyntax-only", str(every)] + [f for f in flags if f.startswith("-I")], cwd=tmp)
        cases.check(TOGETHER, bool(headers), "no headers installed")
        print(f"all {len(headers)} installed headers compile together against the installed tree alone")
    except Failed as e:
        cases.fail(TOGETHER, e)
    src = pathlib.Path(tmp) / "main.cpp"
    src.write_text(PROGRAM)
    exe = pathlib.Path(tmp) / "main"
    libdirs = [f[2:] for f in flags if f.startswith("-L")]
    # Run from the temporary folder, so that no relative path reaches the
    # source tree.
    try:
        run(cxx + ["-std=c++20", str(src), "-o", str(exe)] + flags, cwd=tmp)
        out = run([str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs)), cwd=tmp)
        cases.check(PKG_PROGRAM, True)
        print(f"the program built against the installed tree ran: {out.strip()}")
    except Failed as e:
        cases.fail(PKG_PROGRAM, e)
    return libdirs


def build_with_cmake(cases, tmp, root, cxx, libdirs):
    """The same program as a CMake project that finds the installed package."""
    cmake = shutil.which("cmake")
    if not cmake:
        cases.skip(CMAKE_PROGRAM, "cmake is not on PATH")
        return
    project = pathlib.Path(tmp) / "cmake_consumer"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    (project / "main.cpp").write_text(PROGRAM)
    build = project / "build"
    # cxx is meson's compiler command: a launcher (ccache) may come first.
    launchers = [a for a in cxx if os.path.basename(a) in ("ccache", "sccache")]
    compiler = [a for a in cxx if a not in launchers][0]
    flags = [a for a in cxx if a not in launchers and a != compiler]
    try:
        run([cmake, "-S", str(project), "-B", str(build), f"-DCMAKE_PREFIX_PATH={root}",
             f"-DCMAKE_CXX_COMPILER={compiler}", f"-DCMAKE_CXX_FLAGS={' '.join(flags)}"]
            + ([f"-DCMAKE_CXX_COMPILER_LAUNCHER={launchers[0]}"] if launchers else []), cwd=tmp)
        run([cmake, "--build", str(build)], cwd=tmp)
        out = run([str(build / "main")], env=dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs)), cwd=tmp)
        cases.check(CMAKE_PROGRAM, True)
        print(f"the CMake project built against the installed package ran: {out.strip()}")
    except Failed as e:
        cases.fail(CMAKE_PROGRAM, e)


if __name__ == "__main__":
    sys.exit(main())
