#!/usr/bin/env bash
# Builds the environment of the contract tests (tests/sglang/test_sglang_contract.py): a Python 3.11 venv
# with the CPU build of torch and the small packages that importing sglang.srt.server_args needs,
# plus SGLang's own code, each version in its own folder,
#   <venv>/sglang/<version>/   (pip install --no-deps --target; on no sys.path by default)
# so that scripts/sglang_argparse_probe.py can parse launcher's command lines with the real parser
# of each version. Nothing here starts SGLang: CPU-only machines cannot, and the probe only calls
# ServerArgs.add_cli_args + parse_args, as SGLang's prepare_server_args does (python/sglang/srt/
# server_args.py:668 in 0.5.23, :6515 in 0.5.10), which needs torch but no GPU and no model.
#
#   scripts/sglang-contract-env.sh              build unless built (silent when built)
#   scripts/sglang-contract-env.sh --print-venv print the venv's path (builds nothing)
#
# Where: $SGLANG_CONTRACT_VENV if set, else ${XDG_CACHE_HOME:-~/.cache}/launcher/sglang-contract/
# <first 16 hex digits of this file's sha256>. Outside the work tree on purpose: CI runs in a fresh
# clone on the same machine and reuses it, nothing can be committed by mistake, and a change to
# this file gets a new folder (older ones are removed). A build is finished when <venv>/.ready-<same
# digits> exists; an unfinished one is wiped and rebuilt, so a half-built env never passes.
# A fresh build downloads about 600 MB from PyPI and takes about 2.5 minutes (142 s measured on a
# quiet 2-core machine; 5 to 7 minutes seen while other jobs loaded it), 2.6 GB on disk (torch
# 0.75 GB, triton 1 GB); with it built, this script returns at once.
# Other settings: SGLANG_CONTRACT_WHEELS (the folder holding torch 2.13.0+cpu for cp311, default
# /opt/wheels), PYTHON (a Python 3.11, default python3).
# Without that wheel (any machine but this build image), torch 2.13.0 comes from PyPI, which only
# has the CUDA build for Linux x86-64: torch with its nvidia-* wheels and triton, about 3.5 GB
# more to download. It imports without a GPU, and the parser never touches CUDA. SGLang's
# server_args cannot be imported without torch (its utils import torch, triton and
# torch.distributed at module level), and a stand-in torch could hide a real import failure.
set -euo pipefail
cd "$(dirname "$0")/.."

digest=$(sha256sum scripts/sglang-contract-env.sh | cut -c1-16)
cache_root=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/launcher/sglang-contract
venv=${SGLANG_CONTRACT_VENV:-$cache_root/$digest}
wheels=${SGLANG_CONTRACT_WHEELS:-/opt/wheels}
python=${PYTHON:-python3}
# 0.5.23: the newest release, flag --cuda-graph-max-bs-decode. 0.5.10: the last release launcher
# drives with --cuda-graph-max-bs (launcher.plan.command.DECODE_SPELLING_FROM is 0.5.15). Keep in step
# with VERSIONS in tests/sglang/test_sglang_contract.py.
versions=(0.5.23 0.5.10)

if [ "${1:-}" = --print-venv ]; then
  echo "$venv"
  exit 0
fi
stamp="$venv/.ready-$digest"
if [ -f "$stamp" ]; then
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# One build at a time (CI and a developer, or two checkouts); the second waits, then finds it done.
exec 9>"$(dirname "$venv")/.lock-$(basename "$venv")"
flock 9
if [ -f "$stamp" ]; then
  exit 0
fi

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "sglang-contract-env: $python is not Python 3.11 (the local CPU torch wheel is cp311);" \
    "set PYTHON" >&2
  exit 1
fi

start=$SECONDS
echo "sglang-contract-env: building $venv (SGLang ${versions[*]}; takes a few minutes)" >&2
if [ -z "${SGLANG_CONTRACT_VENV:-}" ]; then
  # Builds for older versions of this file (2.6 GB each); only names of 16 hex digits.
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
    -regex '.*/[0-9a-f]{16}' ! -name "$digest" -exec rm -rf {} +
fi
rm -rf "$venv"
"$python" -m venv "$venv"
printf '*\n' >"$venv/.gitignore"  # never committed, should it be put inside a work tree
# pip compiles the bytecode at install: the probe may run with PYTHONDONTWRITEBYTECODE=1 (as
# sessions here do), and compiling torch, transformers and SGLang at each import costs seconds.
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# This machine's pip config names local indexes that lack most packages; pip warns for each.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
lap=$SECONDS
took() {
  echo "sglang-contract-env: $1 in $((SECONDS - lap)) s" >&2
  lap=$SECONDS
}

# torch: the CPU wheel on this disk when there is one (--no-index: nothing else can be picked; its
# own dependencies are pinned below), else PyPI's CUDA build with its dependencies (see above).
if compgen -G "$wheels/torch-2.13.0+cpu-cp311-*.whl" > /dev/null; then
  torch_from=local
  quiet "${pip[@]}" --no-deps --no-index --find-links "$wheels" torch==2.13.0
  took "torch (local CPU wheel)"
else
  torch_from=pypi
  echo "sglang-contract-env: no torch 2.13.0+cpu wheel in $wheels: PyPI's torch 2.13.0 (CUDA" \
    "build, about 3.5 GB with its nvidia-* wheels)" >&2
  quiet "${pip[@]}" torch==2.13.0
  took "torch (PyPI)"
fi

# What `from sglang.srt.server_args import ServerArgs` imports in 0.5.23 and 0.5.10, found by
# listing the distributions in sys.modules after that import, then frozen (pip freeze) so a new
# release on PyPI cannot change the contract env. torchvision is deliberately absent: PyPI's
# build replaces the CPU torch with a CUDA one, and the probe stands in a stub for it.
# The list is closed under dependencies (pip check below proves it), so --no-deps: nothing can
# pull in another torch. Never add a package that depends on torch without a pin 2.13.0 meets.
# PyPI's torch brings the triton it was built with; keep that one.
if [ "$torch_from" = pypi ]; then keep() { grep -v '^triton=='; }; else keep() { cat; }; fi
keep <<'PINS' | quiet "${pip[@]}" --no-deps -r /dev/stdin
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
asttokens==3.0.2
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
dill==0.4.1
executing==2.3.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
ipython==9.18.1
ipython_pygments_lexers==1.1.1
jedi==0.20.1
Jinja2==3.1.6
jiter==0.19.0
markdown-it-py==4.3.0
MarkupSafe==3.0.4
matplotlib-inline==0.2.2
mdurl==0.1.2
mpmath==1.3.0
msgspec==0.22.0
multidict==7.2.1
networkx==3.6.1
numpy==2.4.6
openai==3.57.0
orjson==3.13.0
packaging==26.4
parso==0.8.7
partial-json-parser==0.2.1.1.post7
pexpect==4.9.0
pillow==13.0.0
prompt_toolkit==3.0.53
propcache==0.5.4
psutil==7.2.2
ptyprocess==0.7.0
pure_eval==0.2.4
pybase64==1.5.1
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
pyzmq==27.3.0
regex==2026.11.19
requests==2.34.2
rich==15.0.0
safetensors==0.8.0
setuptools==84.2.1
sentencepiece==0.2.3
shellingham==1.5.4
sniffio==1.3.1
stack-data==0.6.3
starlette==1.10.0
sympy==1.14.0
tokenizers==0.23.3
tqdm==4.70.1
traitlets==5.16.1
transformers==5.24.0
triton==3.9.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
wcwidth==0.9.4
yarl==1.25.1
PINS
took "pinned packages (PyPI)"

"$venv/bin/python" -m pip check >&2
"$venv/bin/python" - "$torch_from" <<'EOF'
import sys
import torch
if sys.argv[1] == "local":
    assert torch.__version__.endswith("+cpu"), f"expected the CPU torch, got {torch.__version__}"
EOF

for v in "${versions[@]}"; do
  quiet "${pip[@]}" --no-deps --target "$venv/sglang/$v" "sglang==$v"
done
took "sglang ${versions[*]} (PyPI)"

# Smoke test: each version's parser loads and parses one command line (SGLang's import-time
# warnings are shown only when it fails).
for v in "${versions[@]}"; do
  if ! log=$(echo '[["--model-path", "m", "--tp-size", "2"]]' \
    | "$venv/bin/python" scripts/sglang_argparse_probe.py --sglang-version "$v" 2>&1 >/dev/null); then
    echo "$log" >&2
    echo "sglang-contract-env: SGLang $v's parser does not load (above); the env is unfinished" >&2
    exit 1
  fi
done
took "smoke test"

touch "$stamp"
echo "sglang-contract-env: ready in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)" >&2
