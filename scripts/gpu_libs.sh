# Sourced by gpu_run.sh and gpu_bench.sh on the GPU machine, for a prebuilt pack: finds the
# CUDA libraries the pack does not carry. cudart is linked (ldd sees it); cuBLAS and cuBLASLt
# are opened at first use (engine/core/cublas_api.h), from the build's toolkit directory or
# the loader's search path, so ldd does not see them.
# Usage: source scripts/gpu_libs.sh ROOT BUILD; then $cuda_missing lists what is still missing.
gpu_libs_root=$1
gpu_libs_build=$2
export LD_LIBRARY_PATH="$gpu_libs_root/$gpu_libs_build/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
have_cublas() {
  local d
  for d in ${LD_LIBRARY_PATH//:/ }; do
    [ -e "$d/libcublasLt.so.13" ] && [ -e "$d/libcublas.so.13" ] && return 0
  done
  ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.13'
}
# From elsewhere (PyTorch's nvidia wheels) when the toolkit's are not found.
if ldd "$gpu_libs_build/bin/switchyard" | grep -q 'not found' || ! have_cublas; then
  for d in $(find /usr/local /usr/lib /opt "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)" \
               \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' \) \
               -printf '%h\n' 2>/dev/null | sort -u); do
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
  done
fi
cuda_missing=$(ldd "$gpu_libs_build/bin/switchyard" "$gpu_libs_build"/lib/*.so* 2>/dev/null |
               grep 'not found' | sort -u | tr -d '\t' | tr '\n' ' ' || true)
have_cublas || cuda_missing+="libcublas.so.13 libcublasLt.so.13 (opened at first use) "
