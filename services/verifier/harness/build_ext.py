"""Builds a candidate's C++/CUDA extension with torch.utils.cpp_extension in a sandbox (stdlib + torch only).

The parent sends the sources' paths, flags and a build directory; this script compiles with ninja,
imports the result once (so missing symbols are build errors, not run-time surprises) and reports.
"""

# mypy: disable-error-code="no-untyped-call,no-any-return"

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import wire


def main() -> None:
    _args, job_file, out = common.start("StitchCUDA extension builder")
    header, _payload = common.read_job(job_file)
    if header.get("arch_list"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = header["arch_list"]
    t0 = common.now()
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(
            name=header["name"],
            sources=header["sources"],
            extra_cflags=header.get("cflags") or None,
            extra_cuda_cflags=header.get("cuda_cflags") or None,
            extra_ldflags=header.get("ldflags") or None,
            build_directory=header["build_dir"],
            with_cuda=bool(header.get("with_cuda")),
            verbose=False,
        )
    except BaseException as exc:
        text = f"{type(exc).__name__}: {exc}"
        wire.write_frame(
            out, {"kind": "build", "ok": False, "error": text[-60000:], "seconds": common.now() - t0}
        )
        common.exit_now(out, 3)
    so = os.path.join(header["build_dir"], header["name"] + ".so")
    wire.write_frame(out, {"kind": "build", "ok": os.path.isfile(so), "so": so, "seconds": common.now() - t0})
    wire.write_frame(out, {"kind": "done", "nonce": header["nonce"]})
    common.exit_now(out, 0)


if __name__ == "__main__":
    main()
