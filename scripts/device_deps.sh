#!/usr/bin/env bash
# Packs what scripts/device_check.sh builds against on a GPU machine that has
# no network and none of our Debian packages: the headers, CMake packages and
# shared libraries of nlohmann-json, yaml-cpp, CLI11, ICU, Protobuf (protoc
# too), GoogleTest, zlib's headers and the part of Boost that Boost.CRC
# includes, as a prefix (usr/...) in .gpu/deps.tar.xz (about 13 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
packages=(nlohmann-json3-dev libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev libicu-dev libicu72 libprotobuf-dev
  libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32 libgtest-dev libgmock-dev zlib1g-dev)
for f in $(dpkg -L "${packages[@]}" | grep -v '/share/doc\|/man/\|/lintian/\|/icu/72\|/pkgconfig' | sort -u); do
  # Static archives only for GoogleTest (its CMake package names them).
  [[ $f == *.a && $f != */libgtest* && $f != */libgmock* ]] && continue
  if [[ -f $f || -L $f ]]; then
    mkdir -p "$stage$(dirname "$f")"
    cp -a "$f" "$stage$f"
  fi
done
# zlib: the GPU machine's own runtime, through the development link.
ln -sf /usr/lib/x86_64-linux-gnu/libz.so.1 "$stage/usr/lib/x86_64-linux-gnu/libz.so"
echo '#include <boost/crc.hpp>
#include <boost/version.hpp>' | g++ -M -x c++ - | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
  while read -r f; do
    mkdir -p "$stage$(dirname "$f")"
    cp -a "$f" "$stage$f"
  done
mkdir -p .gpu
tar cJf .gpu/deps.tar.xz -C "$stage" usr
echo "device_deps: .gpu/deps.tar.xz, $(du -h .gpu/deps.tar.xz | cut -f1)"
