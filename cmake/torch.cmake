# Which LibTorch fsdp.cpp builds against, chosen by FSDP_TORCH:
#   venv    (default when built on its own) the torch in the project's
#           .venv/ (scripts/setup.sh makes it from requirements.txt):
#           PyTorch 2.13, as users have it;
#   system  find_package(Torch) as any LibTorch project does: Torch_DIR,
#           CMAKE_PREFIX_PATH, then the system (Debian's libtorch-dev,
#           LibTorch 1.13). The default inside another project, which then
#           shares that project's Torch;
#   DIR     any other LibTorch: the unzipped download from PyTorch's site
#           (DIR/share/cmake/Torch) or a pip-installed torch package
#           (its site-packages/torch directory).
if(FSDP_TOP_LEVEL)
  set(FSDP_TORCH "venv" CACHE STRING "LibTorch to build against: venv, system, or a LibTorch directory")
else()
  set(FSDP_TORCH "system" CACHE STRING "LibTorch to build against: venv, system, or a LibTorch directory")
endif()

if(FSDP_TORCH STREQUAL "venv")
  set(_fsdp_venv_torch_glob "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch")
  file(GLOB _fsdp_torch_root LIST_DIRECTORIES true "${_fsdp_venv_torch_glob}")
  if(NOT _fsdp_torch_root)
    message(FATAL_ERROR
      "FSDP_TORCH=venv but ${_fsdp_venv_torch_glob} does not exist: run scripts/setup.sh to make the "
      "project venv, or choose another LibTorch with -DFSDP_TORCH=system (Debian's 1.13) or -DFSDP_TORCH=/path/to/libtorch")
  endif()
  list(GET _fsdp_torch_root 0 _fsdp_torch_root)
elseif(FSDP_TORCH STREQUAL "system")
  set(_fsdp_torch_root "")
  # A Torch_DIR inside a LibTorch (an unzipped download, a pip torch's
  # share/cmake/Torch) chooses that LibTorch: pin its libraries as for a
  # directory. TorchConfig alone would take Debian's libtorch.so from the
  # default paths beside these headers, and the link would fail.
  if(Torch_DIR)
    get_filename_component(_fsdp_torch_dir_root "${Torch_DIR}/../../.." ABSOLUTE)
    if(EXISTS "${_fsdp_torch_dir_root}/share/cmake/Torch/TorchConfig.cmake" AND
       EXISTS "${_fsdp_torch_dir_root}/include/torch")
      set(_fsdp_torch_root "${_fsdp_torch_dir_root}")
    endif()
  endif()
else()
  get_filename_component(_fsdp_torch_root "${FSDP_TORCH}" ABSOLUTE)
  if(NOT EXISTS "${_fsdp_torch_root}/share/cmake/Torch/TorchConfig.cmake")
    message(FATAL_ERROR
      "FSDP_TORCH=${FSDP_TORCH}: expected 'venv', 'system', or a LibTorch directory holding "
      "share/cmake/Torch/TorchConfig.cmake (an unzipped LibTorch, or a pip-installed torch package directory)")
  endif()
endif()

if(_fsdp_torch_root AND TARGET torch AND TORCH_LIBRARY)
  # The project found Torch before adding fsdp.cpp: its targets stand
  # (TorchConfig cannot run twice in one project); the check below makes
  # sure they are this LibTorch's.
elseif(_fsdp_torch_root)
  # TorchConfig looks for its libraries and Caffe2 targets on the default
  # paths before its own, and Debian's 1.13 may be there: search the chosen
  # LibTorch first.
  # Only for Torch: its include/ also holds headers of its own Protobuf,
  # which must not stand in for the system's.
  set(_fsdp_prefix_path "${CMAKE_PREFIX_PATH}")
  list(PREPEND CMAKE_PREFIX_PATH "${_fsdp_torch_root}")
  set(Caffe2_DIR "${_fsdp_torch_root}/share/cmake/Caffe2" CACHE PATH "" FORCE)
  # A pip-installed CUDA torch takes its CUDA libraries from the nvidia-*
  # packages beside it, not from the toolkit: link the same NVRTC it loads.
  file(GLOB _fsdp_nvrtc "${_fsdp_torch_root}/../nvidia/cu*/lib/libnvrtc.so.[0-9]*")
  if(_fsdp_nvrtc AND NOT CUDA_nvrtc_LIBRARY)
    list(GET _fsdp_nvrtc 0 _fsdp_nvrtc)
    set(CUDA_nvrtc_LIBRARY "${_fsdp_nvrtc}" CACHE FILEPATH "NVRTC beside the pip-installed torch")
  endif()
  find_package(Torch REQUIRED CONFIG PATHS "${_fsdp_torch_root}/share/cmake/Torch" NO_DEFAULT_PATH)
  set(CMAKE_PREFIX_PATH "${_fsdp_prefix_path}")
else()
  find_package(Torch REQUIRED)
  # Where it was found, for what is looked up beside it below (Gloo's
  # headers, the bundled OpenMP runtime, the nvidia-* packages).
  if(EXISTS "${TORCH_INSTALL_PREFIX}/share/cmake/Torch/TorchConfig.cmake")  # a LibTorch or pip torch, not a distribution's
    set(_fsdp_torch_root "${TORCH_INSTALL_PREFIX}")
  endif()
endif()

# Headers and libraries of one LibTorch: where a project found Torch before
# adding fsdp.cpp, TorchConfig's cached TORCH_LIBRARY may be another's.
if(_fsdp_torch_root AND TORCH_LIBRARY)
  get_filename_component(_fsdp_torch_library "${TORCH_LIBRARY}" REALPATH)
  get_filename_component(_fsdp_torch_root_real "${_fsdp_torch_root}" REALPATH)
  string(FIND "${_fsdp_torch_library}" "${_fsdp_torch_root_real}/" _fsdp_inside)
  if(NOT _fsdp_inside EQUAL 0)
    message(FATAL_ERROR
      "LibTorch's headers come from ${_fsdp_torch_root} but its library from ${TORCH_LIBRARY}, another "
      "LibTorch's (Debian's libtorch-dev, found on the default paths first), and the link would fail. Put "
      "${_fsdp_torch_root} on CMAKE_PREFIX_PATH before find_package(Torch), or configure a fresh build "
      "directory with -DTorch_DIR=${_fsdp_torch_root}/share/cmake/Torch alone.")
  endif()
endif()

# A LibTorch may be built with c10d's Gloo (USE_C10D_GLOO) but ship no Gloo
# headers (PyTorch's wheels and zips). c10d's ProcessGroupGloo.hpp names
# Gloo's classes only through pointers and calls, so declarations suffice:
# cmake/gloo_interface/ has them, with no class layouts, so nothing of
# Gloo's in-memory shape is assumed. Debian's libgloo-dev is never used for
# such a LibTorch: its headers come from another Gloo release.
set(FSDP_GLOO_INTERFACE_DIR "")
if(_fsdp_torch_root AND NOT EXISTS "${_fsdp_torch_root}/include/gloo")
  set(FSDP_GLOO_INTERFACE_DIR "${PROJECT_SOURCE_DIR}/cmake/gloo_interface")
endif()

# PyTorch's torch/version.h carries the version; Torch_VERSION can be empty.
set(FSDP_TORCH_ROOT "${_fsdp_torch_root}")

# OpenMP. LibTorch's at::parallel_for is a header template: without OpenMP
# in our own compile it runs every range on the calling thread. Our OpenMP
# code must share LibTorch's runtime, so that there is one thread pool:
# PyTorch's wheels bundle their own libgomp.so.1 beside libtorch_cpu, which
# we then link instead of the compiler's (same soname, so the loader maps
# one copy: the bundled one, first on the run path). Debian's LibTorch uses
# GCC's libgomp, the compiler's own.
find_package(OpenMP REQUIRED)
add_library(fsdp_openmp INTERFACE)
if(_fsdp_torch_root AND EXISTS "${_fsdp_torch_root}/lib/libgomp.so.1")
  target_compile_options(fsdp_openmp INTERFACE ${OpenMP_CXX_FLAGS})
  target_link_libraries(fsdp_openmp INTERFACE "${_fsdp_torch_root}/lib/libgomp.so.1")
  set(FSDP_OPENMP_RUNTIME "${_fsdp_torch_root}/lib/libgomp.so.1 (LibTorch's)")
else()
  target_link_libraries(fsdp_openmp INTERFACE OpenMP::OpenMP_CXX)
  set(FSDP_OPENMP_RUNTIME "${OpenMP_gomp_LIBRARY} (the compiler's)")
endif()

# NCCL and CUDA come with a CUDA LibTorch; the CPU build never needs CUDA
# headers. c10d's ProcessGroupNCCL.hpp includes nccl.h, which a pip CUDA
# torch has in the nvidia-nccl package beside it.
set(FSDP_WITH_CUDA OFF)
if(TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA)
  set(FSDP_WITH_CUDA ON)
  find_path(FSDP_NCCL_INCLUDE_DIR nccl.h
    HINTS "${_fsdp_torch_root}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_INCLUDE_DIRS})
  # c10d's NCCL headers include CUDA's math libraries' headers (cusparse.h,
  # cublas_v2.h), which a pip CUDA torch has in nvidia/cu*/include, not in
  # the toolkit.
  file(GLOB FSDP_CUDA_LIBRARY_INCLUDE_DIRS LIST_DIRECTORIES true "${_fsdp_torch_root}/../nvidia/cu*/include")
  if(NOT FSDP_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "this LibTorch has CUDA, but nccl.h was not found: install NCCL's headers "
                        "(pip's nvidia-nccl package, or libnccl-dev) or set FSDP_NCCL_INCLUDE_DIR")
  endif()
endif()
