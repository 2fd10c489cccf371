#!/usr/bin/env python3
"""check_record.py WHEEL REL FILE: exit 0 when FILE has the sha256 that WHEEL's RECORD gives its
member REL (a file taken out of a wheel for a wheelhouse part is the wheel's own), else exit with
an ERROR line. Used by staging/build_vllm032.sh and staging/dsv4_026/build.sh."""

import base64
import hashlib
import sys
import zipfile


def main(whl: str, rel: str, path: str) -> None:
    with zipfile.ZipFile(whl) as z:
        rec = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        row = next(r.rsplit(",", 2) for r in z.read(rec).decode().splitlines()
                   if r.startswith(rel + ","))
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    got = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if got != row[1]:
        sys.exit(f"ERROR: {path}: {got}, RECORD of {whl} says {row[1]}")


if __name__ == "__main__":
    main(*sys.argv[1:])
