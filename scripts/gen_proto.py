"""Regenerate fastlane/_proto from proto/ (run: make proto).

protoc writes imports as ``from fastlane.v1 import x_pb2`` (the path under proto/); the
generated modules live in the flat package ``fastlane._proto``, so those imports are rewritten.
With ``--check`` nothing is written: the exit code says whether fastlane/_proto is in sync.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
TARGET = ROOT / "fastlane" / "_proto"
HEADER = '"""Generated from proto/fastlane/v1 by scripts/gen_proto.py. Never edit; run `make proto`."""\n'


def generate(into: Path) -> None:
    sources = sorted(str(path.relative_to(PROTO_ROOT)) for path in (PROTO_ROOT / "fastlane" / "v1").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto shipped with grpcio-tools
    with tempfile.TemporaryDirectory() as scratch:
        status = protoc.main([
            "protoc", f"-I{PROTO_ROOT}", f"-I{include}",
            f"--python_out={scratch}", f"--pyi_out={scratch}", f"--grpc_python_out={scratch}", *sources,
        ])
        if status != 0:
            raise SystemExit(f"protoc failed with status {status}")
        into.mkdir(parents=True, exist_ok=True)
        (into / "__init__.py").write_text(HEADER)
        for produced in sorted((Path(scratch) / "fastlane" / "v1").iterdir()):
            text = re.sub(r"^from fastlane\.v1 import", "from fastlane._proto import", produced.read_text(), flags=re.M)
            (into / produced.name).write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether fastlane/_proto is in sync")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(TARGET, ignore_errors=True)
        generate(TARGET)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / "_proto"
        generate(fresh)
        comparison = filecmp.dircmp(fresh, TARGET, ignore=["__pycache__"])
        stale = comparison.left_only + comparison.right_only + comparison.diff_files
        # dircmp compares shallowly by stat; compare contents to be sure.
        stale += [name for name in comparison.same_files if (fresh / name).read_bytes() != (TARGET / name).read_bytes()]
        if stale:
            print(f"fastlane/_proto is out of sync with proto/ ({', '.join(sorted(stale))}): run `make proto`")
            return 1
    print("fastlane/_proto is in sync with proto/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
