#!/usr/bin/env python3
"""Checks the Dockerfile without a container engine.

- Three stages, Debian 12: `build` on bookworm running scripts/install-deps.sh on the build
  machine's platform ($BUILDPLATFORM: it cross-compiles for another target); `runtime-copied`
  (the target's libraries copied from the build stage, scripts/runtime-libs.sh, onto
  RDP_RUNTIME_BASE, default bookworm-slim) and `runtime` last (the default target) on
  bookworm-slim, both on $TARGETPLATFORM (linux/amd64 and linux/arm64).
- Every package the runtime stage installs exists (`apt-cache show`).
- With --binary: the runtime packages are exactly the Debian packages that own the binary's
  DT_NEEDED libraries, minus those bookworm-slim already has (libc6, libgcc-s1, libstdc++6).
  A missing one would make the container fail to start; an extra one is dead weight.
- .dockerignore keeps what the build needs in the context.
Prints one line per check and "N passed, M failed"; exits 1 on any failure.
"""

import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import Results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
# In debian:bookworm-slim already (Priority: required, or apt's own dependencies).
BASE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
# What the build stage copies and runs: must survive .dockerignore.
BUILD_INPUTS = ["CMakeLists.txt", "VERSION", "scripts/install-deps.sh", "scripts/runtime-libs.sh",
                "scripts/build.sh", "cmake/arm64-toolchain.cmake", "cmd/main.cc",
                "topology/discovery.h", "proto/CMakeLists.txt", "server/CMakeLists.txt",
                "allocator/allocator.h"]


def stages(dockerfile_text):
    """[(base image, [instruction lines])] with continuation lines joined; the FROM line's
    --platform and AS name are the first lines of each stage's list, as "PLATFORM x" and
    "NAME x"."""
    text = re.sub(r"\\\n", " ", dockerfile_text)
    out = []
    args = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "ARG" and "=" in rest and not out:
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        elif word.upper() == "FROM":
            words = rest.split()
            platform = ""
            if words and words[0].startswith("--platform="):
                platform = words.pop(0).partition("=")[2]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            out.append((image, [f"PLATFORM {platform}", f"NAME {name}"]))
        elif out:
            out[-1][1].append(line)
    return out


def apt_packages(lines):
    """Package names after `apt-get install` in RUN lines (options and shell words dropped)."""
    packages = []
    for line in lines:
        for command in re.split(r"&&|;", line):
            words = command.split()
            if "apt-get" in words and "install" in words:
                for word in words[words.index("install") + 1:]:
                    if not word.startswith("-"):
                        packages.append(word)
    return packages


def owning_package(path):
    """Debian package that owns a library path, trying the /usr-merged spellings too."""
    candidates = [path, os.path.realpath(path)]
    for p in list(candidates):
        if p.startswith("/usr/lib/"):
            candidates.append(p[len("/usr"):])
        elif p.startswith("/lib/"):
            candidates.append("/usr" + p)
    for candidate in candidates:
        proc = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if proc.returncode == 0:
            return proc.stdout.split(":")[0].strip()
    return None


def needed_packages(binary):
    """{package: [sonames]} for the binary's direct DT_NEEDED entries, or raises."""
    dyn = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn.stdout)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True)
    paths = dict(re.findall(r"^\s*(\S+) => (/\S+)", ldd.stdout, re.MULTILINE))
    out = {}
    for soname in needed:
        path = paths.get(soname)
        package = owning_package(path) if path else None
        out.setdefault(package or f"<unowned {soname}>", []).append(soname)
    return out


def pattern_regex(pattern):
    """A .dockerignore pattern as a regex: '**' any number of directories, '*' and '?' within
    one path component (Go's filepath.Match plus Docker's '**')."""
    pattern = pattern.strip("/")
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def ignored(path, patterns):
    """Whether Docker leaves path out of the build context: the last pattern matching the path
    or one of its parent directories decides ('!' re-includes)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = pattern_regex(pattern[1:] if negate else pattern)
        if any(regex.match(p) for p in prefixes):
            result = not negate
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dockerfile", default=os.path.join(REPO, "Dockerfile"))
    parser.add_argument("--binary", help="the built rdma-device-plugin, to check its libraries")
    args = parser.parse_args()
    r = Results()

    with open(args.dockerfile) as f:
        parsed = stages(f.read())
    names = [l[0] for l in [[x[len("NAME "):] for x in lines if x.startswith("NAME ")]
                            for _, lines in parsed]]
    r.check("three stages: build, runtime-copied, runtime (the default target, last)",
            names == ["build", "runtime-copied", "runtime"], str(names))
    if names != ["build", "runtime-copied", "runtime"]:
        print(f"{r.passed} passed, {r.failed} failed")
        return 1
    (build_image, build_lines), (copied_image, copied_lines), (runtime_image, runtime_lines) = parsed
    r.check("build stage on Debian 12 (bookworm)", build_image == "debian:bookworm", build_image)
    r.check("build stage installs with scripts/install-deps.sh",
            any("scripts/install-deps.sh" in l for l in build_lines if l.startswith("RUN")))
    r.check("build stage on the build machine's platform (it cross-compiles)",
            "PLATFORM $BUILDPLATFORM" in build_lines, build_lines[0])
    r.check("build stage gathers the target's libraries (scripts/runtime-libs.sh)",
            any("scripts/runtime-libs.sh" in l for l in build_lines if l.startswith("RUN")))
    for name, lines in (("runtime-copied", copied_lines), ("runtime", runtime_lines)):
        r.check(f"{name} stage on the target's platform", "PLATFORM $TARGETPLATFORM" in lines,
                lines[0])
        r.check(f"{name}: entrypoint is the binary",
                any(l.startswith("ENTRYPOINT") and "rdma-device-plugin" in l for l in lines))
        r.check(f"{name}: labelled with RDP_VERSION",
                any(l.startswith("ARG RDP_VERSION=") for l in lines)
                and any("org.opencontainers.image.version" in l for l in lines))
    r.check("runtime-copied on RDP_RUNTIME_BASE, bookworm-slim by default",
            copied_image == "debian:bookworm-slim", copied_image)
    r.check("runtime-copied runs nothing (a foreign target's programs cannot run in the build)",
            not any(l.startswith("RUN") for l in copied_lines))
    r.check("runtime-copied copies the gathered libraries and the binary",
            any(l.startswith("COPY --from=build /out/libs/") for l in copied_lines)
            and any(l.startswith("COPY --from=build /out/rdma-device-plugin") for l in copied_lines))
    r.check("runtime stage on bookworm-slim", runtime_image == "debian:bookworm-slim",
            runtime_image)
    r.check("runtime stage installs no -dev package and no recommends",
            all(not p.endswith("-dev") for p in apt_packages(runtime_lines))
            and any("--no-install-recommends" in l for l in runtime_lines))
    runtime = apt_packages(runtime_lines)
    r.check("runtime stage installs packages", bool(runtime))
    # One apt-cache call for them all: each call loads apt's whole cache (seconds apiece on a
    # loaded machine with a second architecture's lists; the test timed out at 120 s).
    shown = set()
    if runtime:
        proc = subprocess.run(["apt-cache", "show", "--no-all-versions", *runtime],
                              capture_output=True, text=True)
        shown = set(re.findall(r"^Package: (\S+)$", proc.stdout, re.MULTILINE))
    for package in runtime:
        r.check(f"apt-cache show {package}", package in shown,
                (proc.stderr.strip() or "not found") + " (run apt-get update?)")

    if args.binary:
        if r.check(f"binary exists: {args.binary}", os.access(args.binary, os.X_OK)):
            needed = needed_packages(args.binary)
            unowned = sorted(k for k in needed if k.startswith("<unowned"))
            r.check("every linked library belongs to a Debian package", not unowned, str(unowned))
            want = set(needed) - BASE_PACKAGES
            have = set(runtime)
            r.check("runtime stage installs every package the binary links",
                    want <= have, "missing " + str({p: needed[p] for p in sorted(want - have)}))
            r.check("runtime stage installs nothing the binary does not link",
                    have <= want, "extra " + str(sorted(have - want)))

    dockerignore = os.path.join(os.path.dirname(args.dockerfile), ".dockerignore")
    if r.check(".dockerignore exists", os.path.exists(dockerignore)):
        with open(dockerignore) as f:
            patterns = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        dropped = [p for p in BUILD_INPUTS if ignored(p, patterns)]
        r.check(".dockerignore keeps the build's inputs", not dropped, str(dropped))
        r.check(".dockerignore drops .git and build trees",
                ignored(".git/HEAD", patterns) and ignored("build/CMakeCache.txt", patterns)
                and ignored("build-asan/x.o", patterns) and ignored("build-arm64/x.o", patterns))

    print(f"{r.passed} passed, {r.failed} failed")
    return 0 if r.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
