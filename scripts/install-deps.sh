#!/usr/bin/env bash
# Installs DeepInfer's build and test dependencies from Debian packages. Idempotent: packages that
# are already present are skipped, and apt-get runs only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config     # toolchain
  nlohmann-json3-dev                               # JSON (config, safetensors headers, server)
  libcli11-dev                                     # command-line parsing (apps only)
  libgtest-dev libgmock-dev                        # unit tests
  libbenchmark-dev                                 # micro-benchmarks
  libutf8proc-dev                                  # Unicode normalisation (Engram token map)
  libpcre2-dev                                     # Unicode regexes (tokenizer pre-split)
  python3 python3-numpy                            # the independent numpy reference
  libpng-dev libjpeg62-turbo-dev libgif-dev libwebp-dev  # image decoding (vision)
  python3-pil                                      # Pillow: the reference's image preprocessing, in tests
  clang libclang-rt-14-dev                         # libFuzzer targets
  zlib1g-dev                                       # gzip for the server's JSON responses
  curl                                             # raw HTTP checks of the server in tests
  libopenmpi-dev openmpi-bin                       # multi-host ranks
  libdnnl-dev                                      # oneDNN: the bf16 matmul baseline in benchmarks
  procps bc                                        # process checks and timing in e2e tests
  iproute2                                         # two hosts as network namespaces (MPI test)
)
# Node.js (with npm) runs the independent tokenizer and the official OpenAI client in tests. A
# machine may already carry a Node.js from elsewhere; only install Debian's when none is found.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PKGS+=(nodejs npm)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
