# Sourced by scripts/build.sh and scripts/test.sh, from the repository's
# root: every compile goes through ccache (installed by scripts/setup.sh),
# whose cache lives outside the checkout (~/.cache/ccache, or CCACHE_DIR),
# so a fresh clone on the same machine recompiles only what changed.
# FSDP_CCACHE=0 turns it off (docs/building.md, "Compiler cache").
#
# CMake takes CMAKE_CXX_COMPILER_LAUNCHER from the environment when it
# configures a build folder: ours, and the ones tests configure (the
# consumer projects, the fuzz targets). CCACHE_BASEDIR rewrites the
# clone's absolute paths to relative ones (clones at another path still
# differ in the precompiled header's wrapper: docs/building.md); the
# sloppiness lets ccache hash precompiled headers and accept a fresh
# clone's new file times.
if [[ ${FSDP_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
else
  export CMAKE_CXX_COMPILER_LAUNCHER=
fi
