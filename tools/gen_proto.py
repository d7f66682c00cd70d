"""Generate the Python gRPC stubs for every .proto under proto/ into jacana_common/pb.

protoc names imports after the proto package (``from jacana.engine.v1 import engine_pb2``);
the stubs live inside ``jacana_common.pb``, so those imports are rewritten to
``from jacana_common.pb.jacana.engine.v1 import engine_pb2``. The same function backs
``make proto`` and the drift test, so the committed stubs are exactly what it writes.

Usage: python tools/gen_proto.py [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "libs/common/src/jacana_common/pb"
PB_PACKAGE = "jacana_common.pb"


def generate(out_dir: Path) -> list[Path]:
    """Write stubs for all protos under ``proto/`` into ``out_dir``; return files written."""
    from grpc_tools import protoc  # imported here: only needed when generating

    protos = sorted(PROTO_DIR.rglob("*.proto"))
    if not protos:
        raise SystemExit("no .proto files under proto/")
    with tempfile.TemporaryDirectory() as tmp:
        include = Path(protoc.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(p) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        written = []
        for src in sorted(Path(tmp).rglob("*.py*")):
            rel = src.relative_to(tmp)
            dst = out_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = re.sub(
                r"^from (jacana\.[\w.]+) import",
                rf"from {PB_PACKAGE}.\1 import",
                src.read_text(),
                flags=re.M,
            )
            dst.write_text(text)
            written.append(rel)
        # Every directory on the way is a regular package.
        for d in {out_dir, *[(out_dir / r).parent for r in written]}:
            while d != out_dir.parent:
                (d / "__init__.py").touch()
                d = d.parent
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.out == DEFAULT_OUT and DEFAULT_OUT.exists():
        shutil.rmtree(DEFAULT_OUT)
    files = generate(args.out)
    print(f"generated {len(files)} files into {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
