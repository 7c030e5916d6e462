# Prepares a bare H200 device machine (no registry access) to run StitchCUDA from this checkout.
# Source it from the repository root:  . benchmarks/device_env.sh
#
# Expects, carried with the working tree (`carry: [".whl"]`), the wheels its Python 3.12 lacks and the
# bubblewrap .deb the Verifier's sandbox needs; fetch them here with:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl pydantic pydantic_core pydantic-settings python-dotenv \
#     annotated-types typing-inspection 'protobuf>=7.35.1,<8' einops
#     nvidia-cutlass (its headers, for programs that instantiate CUTLASS templates)
#   (and for the GPU tests: pytest pluggy iniconfig packaging pytest-timeout pytest-xdist execnet)
#   (mkdir -p .whl/deb && cd .whl/deb && apt-get download bubblewrap)
# The project itself is not installed: .ci/linktree mirrors setup.py's mapping with links onto this tree,
# so a changed tree is picked up on a warm machine. Everything lands under .device/ (git-ignored).

export PYTHONUNBUFFERED=1
_dev="$PWD/.device"
_wheels=$(ls .whl/*.whl)
if [ "$(cat "$_dev/site/.ready" 2>/dev/null)" != "$_wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_dev/site" .whl/*.whl || return 1
  echo "$_wheels" >"$_dev/site/.ready"
fi
if ! command -v bwrap >/dev/null && [ ! -x "$_dev/bw/usr/bin/bwrap" ]; then
  for deb in .whl/deb/*.deb; do dpkg -x "$deb" "$_dev/bw"; done
fi
.ci/linktree "$_dev/links"
export PATH="$_dev/bw/usr/bin:$PATH"
export PYTHONPATH="$_dev/links:$_dev/site${PYTHONPATH:+:$PYTHONPATH}"
export STITCH_TEST_BUILD_DIR="$_dev/test-builds"
python3 -c 'import torch, stitchcuda.verifier.service as s; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
