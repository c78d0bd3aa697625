#!/usr/bin/env python3
"""Checks the Dockerfile without a container engine.

- Debian 12 on both stages: the build stage on bookworm running scripts/install-deps.sh, the
  runtime stage on bookworm-slim.
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
BUILD_INPUTS = ["CMakeLists.txt", "VERSION", "scripts/install-deps.sh", "cmd/main.cc",
                "topology/discovery.h", "proto/CMakeLists.txt", "server/CMakeLists.txt",
                "allocator/allocator.h"]


def stages(dockerfile_text):
    """[(base image, [instruction lines])] with continuation lines joined."""
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
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
            out.append((image, []))
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
    r.check("two stages", len(parsed) == 2, str([s[0] for s in parsed]))
    if len(parsed) != 2:
        print(f"{r.passed} passed, {r.failed} failed")
        return 1
    (build_image, build_lines), (runtime_image, runtime_lines) = parsed
    r.check("build stage on Debian 12 (bookworm)", build_image == "debian:bookworm", build_image)
    r.check("build stage installs with scripts/install-deps.sh",
            any("scripts/install-deps.sh" in l for l in build_lines if l.startswith("RUN")))
    r.check("runtime stage on bookworm-slim", runtime_image == "debian:bookworm-slim",
            runtime_image)
    r.check("runtime stage installs no -dev package and no recommends",
            all(not p.endswith("-dev") for p in apt_packages(runtime_lines))
            and any("--no-install-recommends" in l for l in runtime_lines))
    runtime = apt_packages(runtime_lines)
    r.check("runtime stage installs packages", bool(runtime))
    for package in runtime:
        proc = subprocess.run(["apt-cache", "show", package], capture_output=True, text=True)
        r.check(f"apt-cache show {package}", proc.returncode == 0 and "Package:" in proc.stdout,
                (proc.stderr.strip() or "not found") + " (run apt-get update?)")
    r.check("entrypoint is the binary",
            any(l.startswith("ENTRYPOINT") and "rdma-device-plugin" in l for l in runtime_lines))

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
                and ignored("build-asan/x.o", patterns))

    print(f"{r.passed} passed, {r.failed} failed")
    return 0 if r.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
