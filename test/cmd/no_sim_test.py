#!/usr/bin/env python3
"""The shipped binary contains no simulator or fake: nothing of sim/ (namespace rdp::sim) is in
rdma-device-plugin. Looks for the mangled namespace, which every symbol of sim/ carries and which
the type names of its polymorphic classes (the kubelet simulator's services) keep even in a stripped
binary; and, as a control that names are there to be found, for the device plugin's.
Exit 0 when the binary has the control and nothing of sim/, 1 otherwise.
"""
import argparse
import sys

SIM = b"3rdp3sim"  # N3rdp3sim...: rdp::sim in Itanium C++ mangling
CONTROL = b"3rdp12deviceplugin"  # rdp::deviceplugin


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    with open(args.binary, "rb") as f:
        data = f.read()
    if CONTROL not in data:
        print(f"{args.binary}: no {CONTROL.decode()} names either: cannot tell (stripped of type names?)")
        return 1
    found = data.count(SIM)
    if found:
        at = data.index(SIM)
        sample = data[max(0, at - 1):at + 60].split(b"\0")[0].decode(errors="replace")
        print(f"{args.binary}: {found} names of rdp::sim (sim/), e.g. {sample}: the product links "
              "the test doubles")
        return 1
    print(f"{args.binary}: nothing of sim/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
